// Status propagation macros (Debian 12's Abseil 20220623 predates its own).
//
//   QPARAMS_RETURN_IF_ERROR(journal->Sync(sequence));
//   QPARAMS_ASSIGN_OR_RETURN(std::string bytes, env->ReadFile(path));
//
// Both return the error as it is; add context at the call instead, where it
// matters.

#ifndef QPARAMS_CORE_STATUS_MACROS_H_
#define QPARAMS_CORE_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Evaluates `expr` (an absl::Status) and returns it from the enclosing function
// unless it is OK.
#define QPARAMS_RETURN_IF_ERROR(expr)                                     \
  do {                                                                    \
    if (::absl::Status qparams_status_ = (expr); !qparams_status_.ok()) { \
      return qparams_status_;                                             \
    }                                                                     \
  } while (false)

// Evaluates `rexpr` (an absl::StatusOr<T>): returns its status from the enclosing
// function unless it is OK, else moves its value into `lhs` (a declaration or an
// lvalue).
#define QPARAMS_ASSIGN_OR_RETURN(lhs, rexpr) \
  QPARAMS_ASSIGN_OR_RETURN_IMPL_(QPARAMS_CONCAT_(qparams_statusor_, __LINE__), lhs, rexpr)

#define QPARAMS_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                   \
  if (!statusor.ok()) return std::move(statusor).status();   \
  lhs = *std::move(statusor)

#define QPARAMS_CONCAT_(a, b) QPARAMS_CONCAT_INNER_(a, b)
#define QPARAMS_CONCAT_INNER_(a, b) a##b

#endif  // QPARAMS_CORE_STATUS_MACROS_H_
