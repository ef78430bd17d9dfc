// NumPy .npy files (format versions 1.0, 2.0 and 3.0) as core tensors: how the CLI
// reads what a Python user saves with np.save.
//
// Target qparams_npy (tools/README.md): a tool over core tensors and files; it
// depends on the core only, never on the RPC client or the wire.

#ifndef QPARAMS_TOOLS_NPY_H_
#define QPARAMS_TOOLS_NPY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace qparams {

// Reads the array in `path`. Supported: C-order arrays of rank >= 1 with descr '<f4'
// (float32), '<f2' (float16) or '<f8' (float64); '=' and '|' stand for
// little-endian, as numpy reads them on a little-endian machine. NumPy has no
// bfloat16, so bf16 tensors travel as their bits: with `as` = kBFloat16, '<u2' and
// '<i2' data are read as bfloat16. When `as` is set, the file must hold that dtype.
//
// A file that cannot be opened or read gives its errno's code (NOT_FOUND if it does
// not exist); a bad file is INVALID_ARGUMENT naming the file and the problem: not a
// regular file, a bad magic or header, big-endian data, fortran_order True, another
// descr, rank 0, or data whose length does not match the shape.
absl::StatusOr<Tensor> ReadNpy(const std::string& path, std::optional<DType> as = std::nullopt);

// Writes `tensor` to `path` as a C-order .npy file (version 1.0 header; 2.0 only if the
// header would not fit). bfloat16 is written as '<u2' bits, which ReadNpy reads back
// with `as` = kBFloat16. A failed write gives its errno's code, naming the file.
absl::Status WriteNpy(const std::string& path, const TensorView& tensor);

// Writes `values` to `path` as a one-dimensional '<u8' (uint64) .npy file, e.g. a
// histogram's counts. Errors as WriteNpy.
absl::Status WriteNpyUint64(const std::string& path, const std::vector<uint64_t>& values);

}  // namespace qparams

#endif  // QPARAMS_TOOLS_NPY_H_
