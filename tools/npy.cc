#include "tools/npy.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <variant>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace qparams {
namespace {

constexpr absl::string_view kMagic("\x93NUMPY", 6);

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

absl::Status Invalid(const std::string& path, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", problem));
}

// A value of the header's Python dict literal: a string, a bool or a tuple of ints.
using HeaderValue = std::variant<std::string, bool, Shape>;

// Parses the header, e.g. "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
// the subset of Python literal syntax that np.save writes. Errors are bare problems,
// for the caller to prefix with the file name.
class HeaderParser {
 public:
  explicit HeaderParser(absl::string_view text) : rest_(text) {}

  absl::StatusOr<std::map<std::string, HeaderValue>> ParseDict() {
    std::map<std::string, HeaderValue> dict;
    if (!Consume('{')) return Error("does not start with '{'");
    while (!Consume('}')) {
      absl::StatusOr<std::string> key = ParseString();
      if (!key.ok()) return key.status();
      if (!Consume(':')) return Error(absl::StrCat("has no ':' after '", *key, "'"));
      absl::StatusOr<HeaderValue> value = ParseValue(*key);
      if (!value.ok()) return value.status();
      if (!dict.emplace(*key, *std::move(value)).second) {
        return Error(absl::StrCat("repeats the key '", *key, "'"));
      }
      if (!Consume(',') && !Peek('}')) return Error("lacks a ',' between entries");
    }
    SkipSpace();
    if (!rest_.empty()) return Error("has text after the closing '}'");
    return dict;
  }

 private:
  static absl::Status Error(absl::string_view problem) {
    return absl::InvalidArgumentError(absl::StrCat("the .npy header ", problem));
  }

  void SkipSpace() {
    while (!rest_.empty() && absl::ascii_isspace(rest_.front())) rest_.remove_prefix(1);
  }
  bool Peek(char c) {
    SkipSpace();
    return !rest_.empty() && rest_.front() == c;
  }
  bool Consume(char c) {
    if (!Peek(c)) return false;
    rest_.remove_prefix(1);
    return true;
  }
  bool ConsumeWord(absl::string_view word) {
    SkipSpace();
    return absl::ConsumePrefix(&rest_, word);
  }

  absl::StatusOr<std::string> ParseString() {
    SkipSpace();
    if (rest_.empty() || (rest_.front() != '\'' && rest_.front() != '"')) {
      return Error("has a key or value that is not a quoted string");
    }
    const char quote = rest_.front();
    const size_t end = rest_.find(quote, 1);
    if (end == absl::string_view::npos) return Error("has an unterminated string");
    std::string s(rest_.substr(1, end - 1));
    rest_.remove_prefix(end + 1);
    return s;
  }

  absl::StatusOr<HeaderValue> ParseValue(absl::string_view key) {
    if (Peek('\'') || Peek('"')) {
      absl::StatusOr<std::string> s = ParseString();
      if (!s.ok()) return s.status();
      return HeaderValue(*std::move(s));
    }
    if (ConsumeWord("True")) return HeaderValue(true);
    if (ConsumeWord("False")) return HeaderValue(false);
    if (Consume('(')) {
      Shape shape;
      while (!Consume(')')) {
        SkipSpace();
        int64_t dim = 0;
        size_t digits = 0;
        while (digits < rest_.size() && absl::ascii_isdigit(rest_[digits])) {
          if (dim > (INT64_MAX - 9) / 10) return Error("has a dim too large for int64");
          dim = dim * 10 + (rest_[digits++] - '0');
        }
        if (digits == 0) return Error(absl::StrCat("has a non-integer in '", key, "'"));
        rest_.remove_prefix(digits);
        Consume('L');  // Python 2 wrote longs as "3L"
        shape.push_back(dim);
        if (!Consume(',') && !Peek(')')) return Error(absl::StrCat("has a malformed '", key, "'"));
      }
      return HeaderValue(std::move(shape));
    }
    if (Peek('[')) {
      return Error(absl::StrCat("has a structured '", key, "'; only plain arrays are supported"));
    }
    return Error(absl::StrCat("has an unsupported value for '", key, "'"));
  }

  absl::string_view rest_;
};

// The dtype that a descr such as '<f4' stands for. `as` picks bfloat16 for 16-bit
// integers, whose bits are how bf16 arrays get into NumPy.
absl::StatusOr<DType> DTypeFromDescr(const std::string& path, absl::string_view descr,
                                     std::optional<DType> as) {
  constexpr absl::string_view kSupported =
      "supported are '<f4' (float32), '<f2' (float16), '<f8' (float64), and '<u2' or '<i2' "
      "read as bfloat16 bits";
  if (descr.size() < 2 || absl::string_view("<=|>").find(descr[0]) == absl::string_view::npos) {
    return Invalid(path, absl::StrCat("unsupported dtype '", descr, "'; ", kSupported));
  }
  if (descr[0] == '>') {
    return Invalid(path, absl::StrCat("big-endian data ('", descr,
                                      "') is not supported; save it little-endian, e.g. "
                                      "arr.astype(arr.dtype.newbyteorder('<'))"));
  }
  // '=' (native) and '|' (no order) mean little-endian as numpy reads them here.
  const absl::string_view kind = descr.substr(1);
  DType dtype;
  if (kind == "f4") {
    dtype = DType::kFloat32;
  } else if (kind == "f2") {
    dtype = DType::kFloat16;
  } else if (kind == "f8") {
    dtype = DType::kFloat64;
  } else if (kind == "u2" || kind == "i2") {
    if (as != DType::kBFloat16) {
      return Invalid(path, absl::StrCat("dtype '", descr,
                                        "' holds 16-bit integers; read them as bfloat16 bits "
                                        "(qparams-cli --dtype=bfloat16)"));
    }
    return DType::kBFloat16;
  } else {
    return Invalid(path, absl::StrCat("unsupported dtype '", descr, "'; ", kSupported));
  }
  if (as.has_value() && *as != dtype) {
    return Invalid(
        path, absl::StrCat("holds ", DTypeName(dtype), " ('", descr, "'), not ", DTypeName(*as)));
  }
  return dtype;
}

// Little-endian unsigned integer of `bytes`.
uint32_t LittleEndian(absl::string_view bytes) {
  uint32_t v = 0;
  for (size_t i = bytes.size(); i-- > 0;) v = (v << 8) | static_cast<uint8_t>(bytes[i]);
  return v;
}

// Reads exactly `size` bytes into `out`; false at a short read.
bool ReadExactly(std::FILE* f, char* out, size_t size) {
  return size == 0 || std::fread(out, 1, size, f) == size;
}

}  // namespace

absl::StatusOr<Tensor> ReadNpy(const std::string& path, std::optional<DType> as) {
  File file(std::fopen(path.c_str(), "rb"));
  if (file == nullptr) return absl::ErrnoToStatus(errno, path);
  struct stat st;
  if (fstat(fileno(file.get()), &st) != 0) return absl::ErrnoToStatus(errno, path);
  // The data's length is checked against the file's size before it is read.
  if (!S_ISREG(st.st_mode)) return Invalid(path, "not a regular file");
  const int64_t file_size = st.st_size;

  // Magic, version, then the header length: 2 bytes in version 1.0, 4 in 2.0 and 3.0.
  std::string prefix(8, '\0');
  if (!ReadExactly(file.get(), prefix.data(), prefix.size()) || !absl::StartsWith(prefix, kMagic)) {
    return Invalid(path, "not a .npy file (no \\x93NUMPY magic)");
  }
  const int major = static_cast<uint8_t>(prefix[6]);
  const int minor = static_cast<uint8_t>(prefix[7]);
  if ((major != 1 && major != 2 && major != 3) || minor != 0) {
    return Invalid(path, absl::StrCat(".npy format version ", major, ".", minor,
                                      " is not supported (1.0, 2.0 and 3.0 are)"));
  }
  std::string length_bytes(major == 1 ? 2 : 4, '\0');
  if (!ReadExactly(file.get(), length_bytes.data(), length_bytes.size())) {
    return Invalid(path, "the .npy header is truncated");
  }
  const int64_t header_length = LittleEndian(length_bytes);
  const int64_t data_offset = 8 + static_cast<int64_t>(length_bytes.size()) + header_length;
  if (data_offset > file_size) return Invalid(path, "the .npy header is truncated");
  std::string header(header_length, '\0');
  if (!ReadExactly(file.get(), header.data(), header.size())) {
    return Invalid(path, "the .npy header is truncated");
  }

  absl::StatusOr<std::map<std::string, HeaderValue>> dict = HeaderParser(header).ParseDict();
  if (!dict.ok()) return Invalid(path, dict.status().message());
  const std::string* descr = nullptr;
  const bool* fortran_order = nullptr;
  const Shape* shape = nullptr;
  for (const auto& [key, value] : *dict) {
    if (key == "descr") {
      descr = std::get_if<std::string>(&value);
    } else if (key == "fortran_order") {
      fortran_order = std::get_if<bool>(&value);
    } else if (key == "shape") {
      shape = std::get_if<Shape>(&value);
    } else {
      return Invalid(path, absl::StrCat("the .npy header has an unknown key '", key, "'"));
    }
  }
  if (descr == nullptr || fortran_order == nullptr || shape == nullptr) {
    return Invalid(path,
                   "the .npy header needs 'descr' (a string), 'fortran_order' (a bool) and "
                   "'shape' (a tuple)");
  }
  if (*fortran_order) {
    return Invalid(path,
                   "fortran_order is True; only C-order arrays are supported "
                   "(save np.ascontiguousarray(arr))");
  }
  absl::StatusOr<DType> dtype = DTypeFromDescr(path, *descr, as);
  if (!dtype.ok()) return dtype.status();
  if (shape->empty()) {
    return Invalid(path, "the array is 0-d (shape ()); tensors must have rank >= 1");
  }
  absl::StatusOr<int64_t> count = NumElements(*shape);
  if (!count.ok()) return Invalid(path, count.status().message());
  const int64_t item_size = ItemSize(*dtype);
  if (*count > INT64_MAX / item_size) {
    return Invalid(path, absl::StrCat("shape ", ShapeString(*shape), " of ", DTypeName(*dtype),
                                      " has more bytes than int64 can count"));
  }
  const int64_t data_size = file_size - data_offset;
  if (data_size != *count * item_size) {
    return Invalid(
        path, absl::StrCat("has ", data_size, " bytes of data, but shape ", ShapeString(*shape),
                           " of ", DTypeName(*dtype), " needs ", *count * item_size));
  }

  Tensor tensor{*dtype, *shape, Bytes::Uninitialized(data_size)};
  if (!ReadExactly(file.get(), tensor.data.data(), tensor.data.size())) {
    return std::ferror(file.get()) ? absl::ErrnoToStatus(errno, path)
                                   : Invalid(path, "the data ended early");
  }
  return tensor;
}

namespace {

// Writes `data`, the C-order values of `shape` in numpy's `descr`, as a .npy file.
absl::Status WriteNpyArray(const std::string& path, absl::string_view descr, const Shape& shape,
                           absl::string_view data) {
  std::string header =
      absl::StrCat("{'descr': '", descr, "', 'fortran_order': False, 'shape': (",
                   absl::StrJoin(shape, ", "), shape.size() == 1 ? "," : "", "), }");
  // As np.save: pad with spaces and a final newline so that the data starts at a
  // multiple of 64 bytes.
  const bool v1 = header.size() + 64 <= 0xffff;
  const size_t prefix_size = v1 ? 10 : 12;
  header.append(63 - (prefix_size + header.size()) % 64, ' ');
  header.push_back('\n');

  std::string prefix(kMagic);
  prefix.push_back(v1 ? 1 : 2);
  prefix.push_back(0);
  for (size_t i = 0; i < prefix_size - 8; ++i) {  // the header length, little-endian
    prefix.push_back(static_cast<char>(header.size() >> (8 * i)));
  }

  File file(std::fopen(path.c_str(), "wb"));
  if (file == nullptr) return absl::ErrnoToStatus(errno, path);
  for (absl::string_view part : {absl::string_view(prefix), absl::string_view(header), data}) {
    if (std::fwrite(part.data(), 1, part.size(), file.get()) != part.size()) {
      return absl::ErrnoToStatus(errno, path);
    }
  }
  if (std::fclose(file.release()) != 0) return absl::ErrnoToStatus(errno, path);
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteNpy(const std::string& path, const TensorView& tensor) {
  absl::string_view descr;
  switch (tensor.dtype()) {
    case DType::kFloat32:
      descr = "<f4";
      break;
    case DType::kFloat16:
      descr = "<f2";
      break;
    case DType::kBFloat16:
      descr = "<u2";
      break;
    case DType::kFloat64:
      descr = "<f8";
      break;
  }
  return WriteNpyArray(path, descr, tensor.shape(), tensor.bytes());
}

absl::Status WriteNpyUint64(const std::string& path, const std::vector<uint64_t>& values) {
  return WriteNpyArray(
      path, "<u8", {static_cast<int64_t>(values.size())},
      absl::string_view(reinterpret_cast<const char*>(values.data()), values.size() * 8));
}

}  // namespace qparams
