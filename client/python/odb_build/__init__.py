"""Build helpers of client/python/setup.py (not installed: the package is `odb` alone).

* static_deps: ODB_STATIC_DEPS, the position-independent ZeroMQ/protobuf-lite/abseil archives;
* bundle: copies a binary's non-system shared libraries into odb/.libs (auditwheel's approach);
* odbd: builds the daemon with Bazel for the package's odb/bin/odbd.
"""
