// One open OpenAI API request, as the service keeps it between the HTTP handler that queued its
// job and the result (or the client's disconnect) that ends it. io thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "service/http_server.h"
#include "service/openai_api.h"
#include "service/text_deltas.h"

namespace moebatch {

/// See the file comment.
struct ApiCall {
  std::shared_ptr<HttpExchange> ex;  ///< where the answer goes
  ApiResponseId rid;                 ///< id, kind, created, model of the response
  bool stream = false;               ///< server-sent events
  bool include_usage = false;        ///< stream_options.include_usage
  int64_t prompt_tokens = 0;         ///< as counted at intake
  std::vector<std::string> stop;     ///< the job's stop strings (a rerun restarts deltas)
  std::optional<TextDeltas> deltas;  ///< streaming: decoder of the current run
  std::string sent;                  ///< text streamed so far
};

}  // namespace moebatch
