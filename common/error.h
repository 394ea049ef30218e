// The one error family of the project. Every check macro (CUDA_CHECK, CUBLAS_CHECK, NCCL_CHECK,
// SQLITE_CHECK, MB_CHECK) throws a moebatch::Error carrying the failed expression, file and line.
// At service boundaries these are caught and turned into a failed job or a clean exit; they are
// never used for control flow inside hot loops.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace moebatch {

/// Base exception: a message that already names what failed and where.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Bad input from outside (a file, a job row, a frame, a flag): the caller's fault, not ours.
class InputError : public Error {
 public:
  using Error::Error;
};

/// Formats "what (expr) at file:line" and throws Error. Out of line to keep call sites small.
[[noreturn]] void throw_check_failure(std::string_view what, std::string_view expr,
                                      const char* file, int line);

}  // namespace moebatch

/// Internal invariant / validation check with a message: MB_CHECK(n > 0, "n must be positive").
#define MB_CHECK(cond, msg)                                                  \
  do {                                                                       \
    if (!(cond)) ::moebatch::throw_check_failure((msg), #cond, __FILE__, __LINE__); \
  } while (0)
