// EmbeddingPool: the image embeddings the vision service writes and the worker reads in place.
// n_slots slots of [rows_per_slot, hidden] float32 rows, one image's projected features per slot.
//
// On the CPU backend the pool is Boost.Interprocess shared memory: the vision service creates it
// (replacing a stale region of the same name) and owns it; the worker opens it by the name the
// vision service announces and reads the rows through the mapping (StepBatch::embed_rows, host
// memory), so embeddings never travel over a socket.
//
// On a GPU the rows are one device allocation of the vision service, exported with
// cudaIpcGetMemHandle: the shared-memory region then holds only the header, with the IPC handle
// and the device's UUID (EmbeddingPoolDevice), and the worker maps the rows with
// cudaIpcOpenMemHandle (ModelRunner::map_device_embeddings). Same geometry, slot numbering and
// row_index either way; this class never touches device memory itself.
//
// What must stay true: the region starts with a header (magic, layout version, geometry,
// incarnation) that open() checks, so a reader never interprets a region of another layout or
// another vision process; the scheduler decides which slot holds which image (the pool has no
// allocation of its own) and never touches the rows.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "common/status.h"

namespace litellama {

struct EmbeddingPoolGeometry {
  int32_t n_slots = 0;
  int32_t rows_per_slot = 0;  // image tokens of one image (LlavaConfig::image_seq_length)
  int32_t hidden = 0;         // the text model's hidden size
  bool operator==(const EmbeddingPoolGeometry&) const = default;
};

// Where a device pool's rows are: the exporting process's cudaIpcMemHandle_t of the allocation
// (its bytes) and the UUID of the GPU that holds it (cudaDeviceProp::uuid). And how a reader knows
// that rows are complete: the exporter's cudaIpcEventHandle_t of an interprocess event recorded
// after each encode's last write (a reader waits for it before reading rows the scheduler
// announced), and, at finished_ns_offset bytes into the allocation (past the rows; 0: none), a
// uint64 the exporter's stream sets to the GPU's nanosecond time (kernels/device_time.h) when an
// encode's rows are complete.
struct EmbeddingPoolDevice {
  std::array<uint8_t, 64> ipc_handle{};
  std::array<uint8_t, 16> device_uuid{};
  std::array<uint8_t, 64> ready_event{};
  uint64_t finished_ns_offset = 0;
};

class EmbeddingPool {
 public:
  // Creates the region (replacing a stale one of the same name) and owns it: removed on
  // destruction. Fails on a non-positive geometry or a region above 1 TiB.
  // With `device`, the rows are the caller's device allocation of rows_bytes(geometry) bytes and
  // the region holds the header alone.
  static Result<std::unique_ptr<EmbeddingPool>> create(const std::string& name,
                                                       const EmbeddingPoolGeometry& geometry,
                                                       uint64_t incarnation,
                                                       const EmbeddingPoolDevice* device = nullptr);
  // Bytes of the rows of a pool of this geometry (all slots, padding included); 0 when the
  // geometry is invalid.
  static uint64_t rows_bytes(const EmbeddingPoolGeometry& geometry);
  // Opens an existing region; checks the header (magic, layout version, geometry) and, when
  // `incarnation` is non-zero, that the region belongs to that vision process (kUnavailable
  // otherwise). kNotFound when no region has that name. Does not remove it.
  static Result<std::unique_ptr<EmbeddingPool>> open(const std::string& name,
                                                     uint64_t incarnation = 0);
  // Removes a region left behind by a process that died (no error when there is none).
  static void remove(const std::string& name);

  ~EmbeddingPool();
  EmbeddingPool(const EmbeddingPool&) = delete;
  EmbeddingPool& operator=(const EmbeddingPool&) = delete;

  const std::string& name() const { return name_; }
  const EmbeddingPoolGeometry& geometry() const { return geometry_; }
  uint64_t incarnation() const { return incarnation_; }
  // Whether the rows are in device memory (then rows() is empty and device() says where).
  bool on_device() const { return on_device_; }
  const EmbeddingPoolDevice& device() const { return device_; }
  // Slot `slot`'s rows (host pools), [rows_per_slot * hidden], 64-byte aligned; empty when slot is
  // outside [0, n_slots) or the pool is on a device.
  std::span<float> rows(int32_t slot);
  std::span<const float> rows(int32_t slot) const;
  // Where row `row` of slot `slot` lies, counted in rows of `hidden` floats from rows(0).data():
  // rows(0).data() + row_index(slot, row) * hidden is that row (slots start a whole number of
  // rows apart, so one base and an index reach every row in place). -1 when slot is outside
  // [0, n_slots) or row outside [0, rows_per_slot).
  int64_t row_index(int32_t slot, int32_t row) const;
  // Bytes of the header and all rows, wherever the rows are.
  size_t size_bytes() const;

 private:
  struct Impl;
  EmbeddingPool(std::string name, bool owner, std::unique_ptr<Impl> impl,
                EmbeddingPoolGeometry geometry, uint64_t incarnation);

  std::string name_;
  bool owner_ = false;
  bool on_device_ = false;
  EmbeddingPoolDevice device_;
  std::unique_ptr<Impl> impl_;
  EmbeddingPoolGeometry geometry_;
  uint64_t incarnation_ = 0;
};

}  // namespace litellama
