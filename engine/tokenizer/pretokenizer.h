// The Split pre-tokenizer: a regex cuts normalized text into pieces before BPE. Hugging Face
// compiles these patterns with Oniguruma; we use PCRE2 (UTF + UCP, JIT) after translating the
// few constructs whose meaning differs between the two engines (see translate_onig_pattern).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace moebatch::tok {

/// Rewrites an Oniguruma pattern for PCRE2: `\s` / `\S` become explicit classes of the Unicode
/// White_Space property (Oniguruma's definition; PCRE2's \s differs, e.g. on U+180E).
/// Throws InputError for a construct it cannot translate (`\S` inside a bracket class).
std::string translate_onig_pattern(std::string_view pattern);

/// A compiled split pattern with "Isolated" behaviour: every match and every gap between
/// matches becomes its own piece, in order, so the pieces concatenate back to the input.
class RegexSplitter {
 public:
  /// Compiles `onig_pattern` (as written in tokenizer.json); InputError if it does not compile.
  explicit RegexSplitter(std::string_view onig_pattern);
  ~RegexSplitter();
  RegexSplitter(RegexSplitter&&) noexcept;
  RegexSplitter& operator=(RegexSplitter&&) noexcept;

  /// Calls `piece` for each piece of `text` (valid UTF-8, not re-checked) in order.
  void split(std::string_view text, const std::function<void(std::string_view)>& piece) const;

  /// Whether PCRE2's JIT compiled the pattern (otherwise the interpreter is used).
  bool jit() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moebatch::tok
