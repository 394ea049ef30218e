#include "queue/job.h"

#include <array>
#include <utility>

namespace moebatch {
namespace {

constexpr std::array<std::pair<JobState, std::string_view>, 5> kStates = {{
    {JobState::Queued, "queued"},
    {JobState::Running, "running"},
    {JobState::Done, "done"},
    {JobState::Failed, "failed"},
    {JobState::Cancelled, "cancelled"},
}};

}  // namespace

std::string_view job_state_to_string(JobState s) {
  for (const auto& [state, name] : kStates) {
    if (state == s) return name;
  }
  return "unknown";
}

std::optional<JobState> job_state_from_string(std::string_view s) {
  for (const auto& [state, name] : kStates) {
    if (name == s) return state;
  }
  return std::nullopt;
}

bool job_state_is_final(JobState s) {
  return s == JobState::Done || s == JobState::Failed || s == JobState::Cancelled;
}

std::string_view prompt_kind_to_string(PromptKind k) {
  return k == PromptKind::Chat ? "chat" : "text";
}

std::optional<PromptKind> prompt_kind_from_string(std::string_view s) {
  if (s == "text") return PromptKind::Text;
  if (s == "chat") return PromptKind::Chat;
  return std::nullopt;
}

}  // namespace moebatch
