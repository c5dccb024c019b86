#ifndef ODB_COMMON_STATUS_MACROS_H_
#define ODB_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Early-return helpers in the spirit of leveldb's `if (!s.ok()) return s;`.
#define ODB_RETURN_IF_ERROR(expr)               \
  do {                                          \
    if (::absl::Status _odb_s = (expr); !_odb_s.ok()) { \
      return _odb_s;                            \
    }                                           \
  } while (0)

#define ODB_CONCAT_INNER_(a, b) a##b
#define ODB_CONCAT_(a, b) ODB_CONCAT_INNER_(a, b)
#define ODB_ASSIGN_OR_RETURN(lhs, expr) \
  ODB_ASSIGN_OR_RETURN_IMPL_(ODB_CONCAT_(_odb_statusor_, __LINE__), lhs, expr)
#define ODB_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(*tmp)

#endif  // ODB_COMMON_STATUS_MACROS_H_
