// Owned raw bytes: what a Tensor holds.

#ifndef QPARAMS_CORE_BYTES_H_
#define QPARAMS_CORE_BYTES_H_

#include <cstddef>
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"

namespace qparams {

// Like std::string, except that new bytes are left uninitialized: the range pass
// writes every byte of its outputs, and zero-filling them first (faulting their pages
// in on one thread) cost a tenth of the pass on block-wise layouts.
class Bytes {
 public:
  Bytes() = default;
  // Copies `bytes`. Implicit, so that a std::string or string_view stands in.
  Bytes(absl::string_view bytes) : Bytes(Uninitialized(bytes.size())) {  // NOLINT
    if (!bytes.empty()) std::memcpy(data_.get(), bytes.data(), bytes.size());
  }
  Bytes(const std::string& bytes) : Bytes(absl::string_view(bytes)) {}  // NOLINT
  Bytes(const Bytes& other) : Bytes(other.view()) {}
  Bytes& operator=(const Bytes& other) { return *this = Bytes(other); }
  Bytes(Bytes&&) noexcept = default;
  Bytes& operator=(Bytes&&) noexcept = default;

  // `size` bytes of unspecified value.
  static Bytes Uninitialized(size_t size) {
    Bytes b;
    b.data_.reset(new char[size]);
    b.size_ = size;
    return b;
  }

  char* data() { return data_.get(); }
  const char* data() const { return data_.get(); }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  absl::string_view view() const { return absl::string_view(data_.get(), size_); }
  operator absl::string_view() const { return view(); }  // NOLINT

  friend bool operator==(const Bytes& a, const Bytes& b) { return a.view() == b.view(); }
  friend bool operator!=(const Bytes& a, const Bytes& b) { return !(a == b); }

 private:
  std::unique_ptr<char[]> data_;
  size_t size_ = 0;
};

}  // namespace qparams

#endif  // QPARAMS_CORE_BYTES_H_
