// Helpers of the worker tests: temporary directories, the source tree, cached test models.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "services/worker/checkpoint.h"
#include "services/worker/random_checkpoint.h"

namespace litellama::test {

// A fresh directory removed at destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "litellama-test-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string sub(const std::string& name) const { return (std::filesystem::path(path_) / name); }

 private:
  std::string path_;
};

// The source tree and the built programs: the environment when set, else where the build put them.
inline std::string source_dir() {
  const char* env = std::getenv("LITELLAMA_SOURCE_DIR");
  return env && *env ? env : LITELLAMA_TEST_SOURCE_DIR;
}

inline std::string bin_dir() {
  const char* env = std::getenv("LITELLAMA_BIN_DIR");
  return env && *env ? env : LITELLAMA_TEST_BIN_DIR;
}

// What a run of the litellama program gave.
struct CommandResult {
  int exit_code = -1;
  bool signaled = false;
  std::string output;  // stdout and stderr
};

// Runs `bin_dir()/litellama ARGS` (through the shell) and collects its output and exit status.
inline CommandResult run_litellama(const std::string& args) {
  const std::string cmd = bin_dir() + "/litellama " + args + " 2>&1";
  CommandResult r;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) r.output.append(buf, n);
  const int status = ::pclose(pipe);
  r.signaled = WIFSIGNALED(status);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// Writes preset `name` (float32 storage unless `dtype` says otherwise) with `seed` into dir.
inline Status write_model(const std::string& dir, const std::string& name, uint64_t seed,
                          int32_t n_shards = 1, DType dtype = DType::kF32) {
  LITELLAMA_ASSIGN_OR_RETURN(RandomCheckpointPreset preset, find_random_checkpoint_preset(name));
  RandomCheckpointOptions options;
  options.seed = seed;
  options.storage_dtype = dtype;
  options.n_shards = n_shards;
  return write_random_checkpoint(dir, preset.config, options);
}

// write_model that fails the test on error.
inline void make_model(const std::string& dir, const std::string& name, uint64_t seed,
                       int32_t n_shards = 1, DType dtype = DType::kF32) {
  const Status st = write_model(dir, name, seed, n_shards, dtype);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
}

// Writes preset `name` with seed 1 into dir and opens it.
inline Result<Checkpoint> open_new_model(const std::string& dir, const std::string& name) {
  LITELLAMA_RETURN_IF_ERROR(write_model(dir, name, 1));
  return Checkpoint::open(dir);
}

}  // namespace litellama::test
