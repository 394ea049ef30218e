#include "engine/tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "common/error.h"

namespace moebatch::tok {
namespace {

// Unicode White_Space, the set Oniguruma's \s matches in Unicode mode.
constexpr std::string_view kWhiteSpaceItems =
    "\\x{9}-\\x{D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

// JIT stack used when the default one (32 KiB on the machine stack) runs out on long inputs.
constexpr std::size_t kJitStackStart = 64 * 1024;
constexpr std::size_t kJitStackMax = 64 * 1024 * 1024;

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return std::string(reinterpret_cast<const char*>(buf));
}

}  // namespace

std::string translate_onig_pattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      ++i;
      if (e == 's') {
        if (in_class) out.append(kWhiteSpaceItems);
        else out.append("[").append(kWhiteSpaceItems).append("]");
      } else if (e == 'S') {
        if (in_class) {
          throw InputError("pre-tokenizer regex: \\S inside a bracket class is not supported");
        }
        out.append("[^").append(kWhiteSpaceItems).append("]");
      } else {
        out.push_back('\\');
        out.push_back(e);
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < p.size() && p[i + 1] == '^') out.push_back(p[++i]);
      if (i + 1 < p.size() && p[i + 1] == ']') out.push_back(p[++i]);
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
  }
  return out;
}

struct RegexSplitter::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Impl() { pcre2_code_free(code); }
};

RegexSplitter::RegexSplitter(std::string_view onig_pattern) : impl_(std::make_unique<Impl>()) {
  const std::string pattern = translate_onig_pattern(onig_pattern);
  int err = 0;
  PCRE2_SIZE err_off = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
  if (impl_->code == nullptr) {
    throw InputError("pre-tokenizer regex does not compile at offset " +
                     std::to_string(err_off) + ": " + pcre2_message(err) + " (pattern " +
                     std::string(onig_pattern) + ")");
  }
  // JIT is an optimisation only: a build of PCRE2 without it still matches correctly.
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

RegexSplitter::~RegexSplitter() = default;
RegexSplitter::RegexSplitter(RegexSplitter&&) noexcept = default;
RegexSplitter& RegexSplitter::operator=(RegexSplitter&&) noexcept = default;

bool RegexSplitter::jit() const { return impl_->jit; }

void RegexSplitter::split(std::string_view text,
                          const std::function<void(std::string_view)>& piece) const {
  using MatchData = std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)>;
  using MatchContext = std::unique_ptr<pcre2_match_context, decltype(&pcre2_match_context_free)>;
  using JitStack = std::unique_ptr<pcre2_jit_stack, decltype(&pcre2_jit_stack_free)>;
  MatchData md(pcre2_match_data_create_from_pattern(impl_->code, nullptr),
               &pcre2_match_data_free);
  MatchContext mctx(nullptr, &pcre2_match_context_free);
  JitStack stack(nullptr, &pcre2_jit_stack_free);
  MB_CHECK(md != nullptr, "pcre2_match_data_create failed");

  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const std::size_t n = text.size();
  std::size_t pos = 0;
  std::size_t emitted = 0;
  while (pos <= n) {
    // The text was validated once up front; without NO_UTF_CHECK PCRE2 would re-validate the
    // whole remaining subject on every call, which is quadratic on long inputs.
    int rc = impl_->jit ? pcre2_jit_match(impl_->code, subject, n, pos, PCRE2_NO_UTF_CHECK,
                                          md.get(), mctx.get())
                        : pcre2_match(impl_->code, subject, n, pos, PCRE2_NO_UTF_CHECK,
                                      md.get(), mctx.get());
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !stack) {
      stack.reset(pcre2_jit_stack_create(kJitStackStart, kJitStackMax, nullptr));
      mctx.reset(pcre2_match_context_create(nullptr));
      MB_CHECK(stack && mctx, "pcre2 JIT stack allocation failed");
      pcre2_jit_stack_assign(mctx.get(), nullptr, stack.get());
      continue;
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      throw Error("pre-tokenizer regex failed at byte " + std::to_string(pos) + ": " +
                  pcre2_message(rc));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const std::size_t start = ov[0];
    const std::size_t end = ov[1];
    if (end == start) {
      // An empty match contributes no piece; step over one whole character.
      pos = start + 1;
      while (pos < n && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (start > emitted) piece(text.substr(emitted, start - emitted));
    piece(text.substr(start, end - start));
    emitted = end;
    pos = end;
  }
  if (emitted < n) piece(text.substr(emitted));
}

}  // namespace moebatch::tok
