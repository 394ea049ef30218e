// Named model shapes for benchmarks and `random:<shape>` model specs: the configs of published
// models (and the seed class), parsed through the same validation as a checkpoint's config.json,
// so a benchmark on random weights runs exactly the code a real checkpoint runs.
#pragma once

#include <string>
#include <vector>

#include "engine/model_config.h"

namespace moebatch {

/// The config of shape `name` (InputError listing the known names otherwise).
ModelConfig named_model_shape(const std::string& name);

/// Names accepted by named_model_shape().
std::vector<std::string> model_shape_names();

}  // namespace moebatch
