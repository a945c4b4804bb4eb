// Local image files for chat image_url parts: a file:// URL is read only when the server was
// given a directory (--allowed-local-media-path) and the file lies under it. The server never
// fetches anything over the network.
//
// What must stay true: the file read is the one whose real path (every symlink resolved) is
// under the directory, checked again on the opened descriptor, so that a symlink swapped in
// between the check and the open cannot lead outside; only regular files are read, never more
// than max_bytes of them; a path outside the directory is refused before the file system is asked
// about it; an error never echoes the client's URL.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace litellama::api {

// The directory local images may come from.
struct LocalMediaDir {
  std::string path;       // absolute and lexically normal, as given
  std::string real_path;  // every symlink resolved
};

// `dir` must be an existing directory (for --allowed-local-media-path at start).
Result<LocalMediaDir> open_local_media_dir(const std::string& dir);

// The bytes of the file a file:// URL names ("file:///abs/path" or "file://localhost/abs/path",
// percent-escapes decoded). Errors: kInvalidArgument (a malformed URL, outside the directory, no
// such file, not a regular file, empty), kResourceExhausted (over max_bytes), kUnavailable (the
// file cannot be read).
Result<std::string> read_local_media(const std::string& url, const LocalMediaDir& dir,
                                     int64_t max_bytes);

}  // namespace litellama::api
