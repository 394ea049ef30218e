// multipart/form-data bodies (RFC 7578), as `POST /v1/files` receives them: the boundary from
// the Content-Type header, then each part's name, filename, content type and bytes. Bounded:
// at most 16 parts, part headers at most 8 KiB; anything malformed is a reason, never a throw.
#pragma once

#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace moebatch {

/// One form field or file.
struct MultipartPart {
  std::string name;          ///< form field name
  std::string filename;      ///< for a file part; empty otherwise
  std::string content_type;  ///< the part's Content-Type, empty when absent
  std::string body;          ///< the bytes
};

/// The boundary a multipart Content-Type names (its `boundary` parameter, quoted or not); empty
/// when there is none.
std::string multipart_boundary(std::string_view content_type);

/// The parts of `body`, or why it cannot be read.
std::variant<std::vector<MultipartPart>, std::string> parse_multipart(std::string_view content_type,
                                                                      std::string_view body);

}  // namespace moebatch
