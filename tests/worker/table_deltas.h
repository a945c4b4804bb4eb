// Greedy decode of several sequences through StepBatchView two ways: every step bringing each
// sequence's whole slot table (StepBatch), or the table sent once to a place of its own in the
// runner's table and then one new entry per step (as the step ring carries it). Both must give
// the same ids and top logits: the runner keeps its table from step to step.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "services/worker/model_runner.h"

namespace litellama::test {

struct DeltaDecode {
  std::vector<std::vector<int32_t>> ids;                    // [seq][step]
  std::vector<std::vector<std::pair<int32_t, float>>> top;  // [step * n_seqs + seq]
};

// slots[s] holds sequence s's slot of each position (prompt + n_steps); with `deltas`, sequence
// s's table lies at bases[s] of the runner's table. With `registered`, the new entries lie in
// host memory registered with the runner (as the worker's step ring is).
inline DeltaDecode decode_sequences(ModelRunner& runner,
                                    const std::vector<std::vector<int32_t>>& prompts,
                                    const std::vector<std::vector<int32_t>>& slots, int32_t n_steps,
                                    bool deltas, const std::vector<int32_t>& bases,
                                    bool registered = false) {
  const auto n = static_cast<int32_t>(prompts.size());
  DeltaDecode r;
  std::vector<int32_t> host(size_t{1} << 16);
  if (registered) {
    const Status st = runner.register_host_memory(host.data(), host.size() * sizeof(int32_t));
    EXPECT_TRUE(st.is_ok()) << st.to_string();
  }
  r.ids.resize(prompts.size());
  StepBatch batch;
  StepOutput out;
  for (int32_t step = 0; step < n_steps; ++step) {
    batch.clear();
    batch.n_top_logits = 4;
    for (int32_t s = 0; s < n; ++s) {
      const auto& p = prompts[static_cast<size_t>(s)];
      const auto& ids = r.ids[static_cast<size_t>(s)];
      const size_t kv = p.size() + ids.size();
      const std::span<const int32_t> table(slots[static_cast<size_t>(s)].data(), kv);
      if (step == 0) {
        batch.add_sequence(p, table, true, {}, 0);
      } else {
        batch.add_sequence(std::span<const int32_t>(&ids.back(), 1), table, true, {}, step);
      }
    }
    StepBatchView view = batch.view();
    std::vector<int32_t> new_start(1, 0), new_slots;
    if (deltas) {
      // Whole tables in the first step, then the newest entry alone.
      for (int32_t s = 0; s < n; ++s) {
        const int32_t kv = batch.kv_len[static_cast<size_t>(s)];
        const int32_t from = step == 0 ? 0 : kv - 1;
        const int32_t* t = slots[static_cast<size_t>(s)].data();
        new_slots.insert(new_slots.end(), t + from, t + kv);
        new_start.push_back(static_cast<int32_t>(new_slots.size()));
      }
      view.slot_start = bases;
      view.new_slot_start = new_start;
      view.new_slots = new_slots;
      if (registered) {
        std::copy(new_slots.begin(), new_slots.end(), host.begin());
        view.new_slots = std::span<const int32_t>(host.data(), new_slots.size());
        view.registered = true;
      }
    }
    const Status st = runner.step(view, &out);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    if (!st.is_ok()) break;
    for (int32_t s = 0; s < n; ++s) {
      r.ids[static_cast<size_t>(s)].push_back(out.sampled_ids[static_cast<size_t>(s)]);
      r.top.push_back(out.top_logits[static_cast<size_t>(s)]);
    }
  }
  if (registered) runner.unregister_host_memory(host.data());
  return r;
}

}  // namespace litellama::test
