#include "engine/tokenizer/streaming.h"

#include "common/error.h"
#include "engine/tokenizer/utf8.h"

namespace moebatch {

std::string IncrementalDecoder::push(TokenId id) {
  const std::string& bytes = tokenizer_->token_bytes(id);
  if (skip_special_ && tokenizer_->is_special(id)) return {};
  pending_ += bytes;
  // Cutting before a truncated sequence's lead byte is safe: no earlier sequence, valid or
  // not, can extend over a lead byte, so the lossy decode of the prefix is final.
  const std::size_t hold = tok::utf8_incomplete_tail(pending_);
  std::string out;
  tok::utf8_append_lossy(std::string_view(pending_).substr(0, pending_.size() - hold), out);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string IncrementalDecoder::push_lenient(int64_t id) {
  static constexpr const char* kReplacement = "\xEF\xBF\xBD";
  if (id < 0 || static_cast<size_t>(id) >= tokenizer_->vocab_size()) return finish() + kReplacement;
  try {
    return push(static_cast<TokenId>(id));
  } catch (const InputError&) {
    return finish() + kReplacement;
  }
}

std::string IncrementalDecoder::finish() {
  std::string out;
  tok::utf8_append_lossy(pending_, out);
  pending_.clear();
  return out;
}

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const std::string& s : stops_) {
    if (s.empty()) throw InputError("stop strings must not be empty");
    tok::utf8_require_valid(s, "stop string");
    max_len_ = std::max(max_len_, s.size());
  }
}

StopMatcher::Step StopMatcher::push(std::string_view piece) {
  Step step;
  if (stopped_) {
    step.stopped = true;
    return step;
  }
  held_.append(piece);
  // Earliest occurrence wins; between stops found at the same place, the first listed.
  std::size_t best = std::string::npos;
  for (std::size_t k = 0; k < stops_.size(); ++k) {
    const std::size_t p = held_.find(stops_[k]);
    if (p < best) {
      best = p;
      step.stop_index = k;
    }
  }
  if (best != std::string::npos) {
    stopped_ = true;
    step.stopped = true;
    step.text = held_.substr(0, best);
    held_.clear();
    return step;
  }
  // Keep the longest suffix that could still grow into a stop string. Stops and text are
  // valid UTF-8, so such a suffix always starts on a character boundary.
  std::size_t keep = 0;
  const std::size_t longest = std::min(held_.size(), max_len_ == 0 ? 0 : max_len_ - 1);
  for (std::size_t len = longest; len > 0 && keep == 0; --len) {
    const std::string_view tail = std::string_view(held_).substr(held_.size() - len);
    for (const std::string& s : stops_) {
      if (s.size() > len && std::string_view(s).substr(0, len) == tail) {
        keep = len;
        break;
      }
    }
  }
  step.text = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return step;
}

std::string StopMatcher::finish() {
  std::string out;
  if (!stopped_) out.swap(held_);
  held_.clear();
  return out;
}

}  // namespace moebatch
