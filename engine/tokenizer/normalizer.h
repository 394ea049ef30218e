// Unicode normalization step of the tokenizer pipeline (tokenizer.json "normalizer"). Only the
// forms byte-level BPE models use are accepted; anything else is refused at load time.
#pragma once

#include <string>
#include <string_view>

namespace moebatch::tok {

/// A normalizer from tokenizer.json: identity or NFC (through utf8proc).
class Normalizer {
 public:
  /// Normalization forms understood by the loader.
  enum class Kind { kNone, kNfc };

  explicit Normalizer(Kind kind = Kind::kNone) : kind_(kind) {}

  /// Returns `text` normalized; the result views `text` itself when nothing can change (pure
  /// ASCII, or no normalizer) and `scratch` otherwise. `text` must be valid UTF-8.
  std::string_view apply(std::string_view text, std::string& scratch) const;

  /// Which form this normalizer applies.
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

/// NFC of a valid UTF-8 string (appended to `out`).
void nfc_append(std::string_view text, std::string& out);

}  // namespace moebatch::tok
