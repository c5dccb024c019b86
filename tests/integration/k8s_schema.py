"""A strict JSON-schema check of Kubernetes manifests, offline.

`kubectl apply --dry-run=client` needs an API server for discovery, and the
schema validators at hand accept unknown fields and any container
restartPolicy string. This one reads the vendored strict subset of the API
schema (k8s/pod-v1-strict.schema.json: additionalProperties false on every
object, the API's enums) and supports exactly the keywords that file uses:
$ref to #/definitions, type, enum, properties, additionalProperties (false or a
schema), required, items. An unsupported keyword is an error, not ignored.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

SCHEMA = Path(__file__).resolve().parent / "k8s/pod-v1-strict.schema.json"
_KNOWN = {"$ref", "$comment", "type", "enum", "properties", "additionalProperties", "required", "items",
          "definitions"}
_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "integer": int}


def load_schema() -> Dict[str, Any]:
    return json.loads(SCHEMA.read_text())


def validate(doc: Any, schema: Dict[str, Any] | None = None) -> List[str]:
    """Every problem in `doc`, each as "<path>: <what is wrong>" (empty: valid)."""
    root = schema if schema is not None else load_schema()
    problems: List[str] = []
    _check(doc, root, root, "", problems)
    return problems


def _type_ok(value: Any, name: str) -> bool:
    if name in ("integer",) and isinstance(value, bool):
        return False
    return isinstance(value, _TYPES[name])


def _check(value: Any, node: Dict[str, Any], root: Dict[str, Any], path: str, out: List[str]) -> None:
    unknown = set(node) - _KNOWN
    if unknown:
        raise ValueError(f"schema keyword(s) {sorted(unknown)} at {path or '/'} are not supported by this checker")
    if "$ref" in node:
        ref = node["$ref"]
        if not ref.startswith("#/definitions/"):
            raise ValueError(f"unsupported $ref {ref}")
        _check(value, root["definitions"][ref[len("#/definitions/"):]], root, path, out)
    where = path or "/"
    if "type" in node:
        types = node["type"] if isinstance(node["type"], list) else [node["type"]]
        if not any(_type_ok(value, t) for t in types):
            out.append(f"{where}: {value!r} is not of type {' or '.join(types)}")
            return
    if "enum" in node and value not in node["enum"]:
        out.append(f"{where}: {value!r} is not one of {node['enum']}")
        return
    if isinstance(value, dict):
        props = node.get("properties", {})
        for key in node.get("required", []):
            if key not in value:
                out.append(f"{where}: required field {key!r} is missing")
        extra = node.get("additionalProperties", True if "properties" not in node else None)
        for key, item in value.items():
            if key in props:
                _check(item, props[key], root, f"{path}/{key}", out)
            elif extra is False:
                out.append(f"{path}/{key}: unknown field {key!r} (known here: {', '.join(sorted(props))})")
            elif isinstance(extra, dict):
                _check(item, extra, root, f"{path}/{key}", out)
            elif extra is None and "$ref" not in node:
                # an object schema that lists properties and says nothing else: strict by default
                out.append(f"{path}/{key}: unknown field {key!r}")
    if isinstance(value, list) and "items" in node:
        for i, item in enumerate(value):
            _check(item, node["items"], root, f"{path}/{i}", out)
