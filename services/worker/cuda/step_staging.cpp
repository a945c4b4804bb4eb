#include "services/worker/cuda/step_staging.h"

#include <algorithm>
#include <cstring>

#include "kernels/attention_decode.h"
#include "kernels/sampling.h"
#include "services/worker/cuda/device_buffer.h"
#include "services/worker/rope_scaling.h"

namespace litellama {

namespace {

constexpr size_t kAlign = 16;

class Packer {
 public:
  size_t take(size_t bytes) {
    const size_t at = next_;
    next_ = align_up(next_ + bytes, kAlign);
    return at;
  }
  size_t total() const { return next_; }

 private:
  size_t next_ = 0;
};

template <typename T>
T* at(void* base, size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
}

// Copies src into dst (when not null) and returns whether every value is in [0, limit): one
// branch-free pass that the compiler vectorizes (a step that brings whole tables carries a slot
// per key of every sequence).
bool copy_in_range(int32_t* dst, std::span<const int32_t> src, int32_t limit) {
  uint32_t outside = 0;
  const size_t n = src.size();
  const int32_t* in = src.data();
  if (dst == nullptr) {
    for (size_t i = 0; i < n; ++i) {
      outside |= static_cast<uint32_t>(in[i] < 0) | static_cast<uint32_t>(in[i] >= limit);
    }
    return outside == 0;
  }
  for (size_t i = 0; i < n; ++i) {
    const int32_t x = in[i];
    dst[i] = x;
    outside |= static_cast<uint32_t>(x < 0) | static_cast<uint32_t>(x >= limit);
  }
  return outside == 0;
}

// Orders the decode work list by each table's first slot: sequences that share a cached prefix
// (the scheduler's prefix cache hands out one copy of it) are then side by side, where the
// cascade planner below finds them as runs. Any order gives the same results: every sequence is
// computed on its own.
void order_by_first_slot(int32_t* work, int32_t n, const StepBatchView& batch,
                         const int32_t* table) {
  std::stable_sort(work, work + n, [&](int32_t a, int32_t b) {
    return table[batch.slot_start[a]] < table[batch.slot_start[b]];
  });
}

// How many leading entries a[0 .. n) and b[0 .. n) agree on. memcmp over blocks first (a table
// pair that shares a prefix agrees over thousands of entries, and memcmp compares many per
// instruction), then the first block that differs element by element.
int32_t common_prefix(const int32_t* a, const int32_t* b, int32_t n) {
  constexpr int32_t kBlock = 256;
  if (n > 0 && std::memcmp(a, b, static_cast<size_t>(n) * sizeof(int32_t)) == 0) return n;
  int32_t i = 0;
  while (i + kBlock <= n && std::memcmp(a + i, b + i, kBlock * sizeof(int32_t)) == 0) i += kBlock;
  return static_cast<int32_t>(std::mismatch(a + i, a + n, b + i).first - a);
}

// The cascade's arrays (kernels/attention_decode.h) for the decode work list `work` (sorted by
// first slot). A group is a run of sequences with the same first slot; its shared length is the
// longest prefix all their tables agree on, short of each one's newest key. A group of two or
// more sharing kCascadeMinSharedKeys keys gets prefix tasks of up to o.members sequences each,
// the prefix split into key ranges when the tasks are too few to fill the device; every sequence
// gets one task for the keys past its group's prefix (all of its keys when it has no group).
// Part rows are numbered work item by work item (its prefix splits, then its own keys). Returns
// the task count, 0 when no group qualifies (nothing is written then).
// How many leading entries, up to len, the tables at lead_start and start agree on; with a memo,
// resumed from their agreement of an earlier step when no block of it has been written since, and
// recorded for the next step.
int32_t tables_agree(const int32_t* table, int32_t lead_start, int32_t start, int32_t len,
                     CascadeMemo* memo) {
  const int32_t* lead = table + lead_start;
  const int32_t* t = table + start;
  if (memo == nullptr) return common_prefix(lead, t, len);
  auto unwritten = [&](int32_t begin, int32_t n, uint64_t since) {
    if (n <= 0) return true;
    for (int32_t blk = begin / CascadeMemo::kBlock; blk <= (begin + n - 1) / CascadeMemo::kBlock;
         ++blk) {
      if (memo->written[static_cast<size_t>(blk)] > since) return false;
    }
    return true;
  };
  CascadeMemo::Agreement& a = memo->agreed[static_cast<size_t>(start / CascadeMemo::kBlock)];
  int32_t from = 0;
  if (a.start == start && a.lead_start == lead_start && unwritten(lead_start, a.agreed, a.step) &&
      unwritten(start, a.agreed, a.step)) {
    from = std::min(a.agreed, len);
  }
  const int32_t agreed = from + common_prefix(lead + from, t + from, len - from);
  a = {start, lead_start, agreed, memo->step};
  return agreed;
}

int32_t plan_cascade(const int32_t* work, int32_t n, const StepBatchView& b, const int32_t* table,
                     const CascadeOptions& o, int32_t n_kv_heads, CascadeMemo* memo,
                     int32_t* n_tasks_out, int32_t* tasks, int32_t* members, int32_t* part_start) {
  struct Group {
    int32_t begin, end, shared, splits;
  };
  std::vector<Group> groups;
  int32_t n_prefix_tasks = 0;
  for (int32_t i = 0; i < n;) {
    const int32_t lead_start = b.slot_start[work[i]];
    int32_t shared = b.kv_len[work[i]] - 1;
    int32_t j = i + 1;
    for (; j < n && table[b.slot_start[work[j]]] == table[lead_start]; ++j) {
      const int32_t len = std::min(shared, b.kv_len[work[j]] - 1);
      shared = tables_agree(table, lead_start, b.slot_start[work[j]], len, memo);
    }
    if (j - i >= 2 && shared >= kCascadeMinSharedKeys) {
      groups.push_back({i, j, shared, 1});
      n_prefix_tasks += (j - i + o.members - 1) / o.members;
    }
    i = j;
  }
  if (groups.empty()) return 0;
  // Split the prefixes while the grid is under two CTAs per multiprocessor.
  const int64_t ctas = static_cast<int64_t>(n_prefix_tasks + n) * n_kv_heads;
  const auto want = static_cast<int32_t>(std::clamp<int64_t>(
      (2 * static_cast<int64_t>(o.n_sms) + ctas - 1) / std::max<int64_t>(ctas, 1), 1,
      kCascadeMaxPrefixSplits));
  std::vector<int32_t> prefix_splits(static_cast<size_t>(n), 0),
      shared_of(static_cast<size_t>(n), 0);
  for (Group& g : groups) {
    g.splits = std::clamp(g.shared / kCascadeMinSharedKeys, 1, want);
    for (int32_t k = g.begin; k < g.end; ++k) {
      prefix_splits[static_cast<size_t>(k)] = g.splits;
      shared_of[static_cast<size_t>(k)] = g.shared;
    }
  }
  part_start[0] = 0;
  for (int32_t k = 0; k < n; ++k) {
    part_start[k + 1] = part_start[k] + prefix_splits[static_cast<size_t>(k)] + 1;
  }
  int32_t n_tasks = 0, n_members = 0;
  auto add_task = [&](int32_t table_seq, int32_t key_begin, int32_t key_end, int32_t first,
                      int32_t count, int32_t part) {
    int32_t* t = tasks + static_cast<ptrdiff_t>(n_tasks++) * kDecodeTaskFields;
    t[kTaskMemberBegin] = n_members;
    t[kTaskMembers] = count;
    t[kTaskTableSeq] = table_seq;
    t[kTaskKeyBegin] = key_begin;
    t[kTaskKeyEnd] = key_end;
    for (int32_t k = first; k < first + count; ++k, ++n_members) {
      members[2 * n_members] = work[k];
      members[2 * n_members + 1] = part_start[k] + part;
    }
  };
  // The long prefix tasks first, so that the short ones fill in behind them.
  for (const Group& g : groups) {
    const int32_t chunk = (g.shared + g.splits - 1) / g.splits;
    for (int32_t sp = 0; sp < g.splits; ++sp) {
      const int32_t key_begin = sp * chunk, key_end = std::min(g.shared, key_begin + chunk);
      for (int32_t k = g.begin; k < g.end; k += o.members) {
        add_task(work[g.begin], key_begin, key_end, k, std::min(o.members, g.end - k), sp);
      }
    }
  }
  for (int32_t k = 0; k < n; ++k) {
    const auto ku = static_cast<size_t>(k);
    add_task(work[k], shared_of[ku], b.kv_len[work[k]], k, 1, prefix_splits[ku]);
  }
  *n_tasks_out = n_tasks;
  return n_tasks;
}

}  // namespace

StepPlan plan_step(const StepBatchView& batch, const ModelConfig& config, bool cascade) {
  StepPlan plan;
  plan.n_tokens = batch.n_tokens();
  plan.n_seqs = batch.n_seqs();
  plan.dynamic_rope = config.rope.type == RopeScalingType::kDynamic;
  plan.logprobs = batch.logprobs;
  for (int32_t s = 0; s < plan.n_seqs; ++s) {
    const int32_t n_new = batch.token_start[s + 1] - batch.token_start[s];
    if (n_new == 1) {
      ++plan.n_decode;
      plan.max_decode_kv_len = std::max(plan.max_decode_kv_len, batch.kv_len[s]);
    } else {
      ++plan.n_prefill;
      plan.max_prefill_n_new = std::max(plan.max_prefill_n_new, n_new);
    }
    if (batch.sample[s]) {
      plan.sampled_seqs.push_back(s);
      const SamplingParams& sp = batch.sampling[static_cast<size_t>(s)];
      plan.greedy_only = plan.greedy_only && sp.is_greedy() && !sp.has_penalties();
    }
  }

  const size_t n_tok = static_cast<size_t>(plan.n_tokens);
  const size_t n_seq = static_cast<size_t>(plan.n_seqs);
  const size_t i32 = sizeof(int32_t);
  Packer p;
  StepLayout& l = plan.layout;
  l.token_ids = p.take(n_tok * i32);
  l.positions = p.take(n_tok * i32);
  l.token_slot = p.take(n_tok * i32);
  l.token_freq_row = p.take(plan.dynamic_rope ? n_tok * i32 : 0);
  l.token_start = p.take((n_seq + 1) * i32);
  l.kv_len = p.take(n_seq * i32);
  l.slot_start = p.take(n_seq * i32);
  l.new_slot_start = p.take((n_seq + 1) * i32);
  l.work_seqs = p.take(n_seq * i32);
  l.sample_rows = p.take(n_seq * i32);
  l.sampling_rows = p.take(n_seq * sizeof(SamplingRow));
  l.freq_table = p.take(plan.dynamic_rope
                            ? (n_seq + 1) * static_cast<size_t>(config.head_dim / 2) * sizeof(float)
                            : 0);
  if (cascade && plan.n_decode >= kCascadeMinDecode) {
    // Bounds: every decode sequence has at most kCascadeMaxPrefixSplits prefix parts and one of
    // its own, each part one member entry; tasks have at least one entry each.
    plan.cascade_max_parts = plan.n_decode * (kCascadeMaxPrefixSplits + 1);
    plan.cascade_max_tasks = plan.cascade_max_parts;
    const auto max_tasks = static_cast<size_t>(plan.cascade_max_tasks);
    l.cascade_n_tasks = p.take(i32);
    l.cascade_tasks = p.take(max_tasks * kDecodeTaskFields * i32);
    l.cascade_members = p.take(max_tasks * 2 * i32);
    l.cascade_part_start = p.take((static_cast<size_t>(plan.n_decode) + 1) * i32);
  }
  // Past the fixed part: only prefill steps carry embedding rows, and no graph runs them.
  plan.n_embed = static_cast<int32_t>(batch.embed_token_index.size());
  plan.embed_rows = batch.embed_rows;
  l.embed_index = p.take(static_cast<size_t>(plan.n_embed) * i32);
  plan.embed_by_row_index = !batch.embed_row_index.empty();
  l.embed_row_index = p.take(batch.embed_row_index.size() * i32);
  // Last, so that new slots copied from where they lie leave one contiguous range to stage.
  plan.n_new_slots = static_cast<int32_t>(batch.new_slots.size());
  l.new_slots = p.take(batch.new_slots.size() * i32);
  l.total_bytes = p.total();
  return plan;
}

Status fill_step(const StepBatchView& batch, const ModelConfig& config, StepPlan* plan_out,
                 int32_t n_kv_slots, bool copy_new_slots, int32_t* table, void* host,
                 const CascadeOptions& cascade, CascadeMemo* memo) {
  StepPlan& plan = *plan_out;
  const StepLayout& l = plan.layout;
  if (!copy_in_range(copy_new_slots ? at<int32_t>(host, l.new_slots) : nullptr, batch.new_slots,
                     n_kv_slots)) {
    return check_kv_slots(batch.new_slots, n_kv_slots);  // names the first bad slot
  }
  if (memo != nullptr) ++memo->step;
  for (int32_t s = 0; s < plan.n_seqs; ++s) {
    const int32_t n_w = batch.new_slot_start[s + 1] - batch.new_slot_start[s];
    const int32_t at_entry = batch.slot_start[s] + batch.kv_len[s] - n_w;
    std::copy_n(batch.new_slots.begin() + batch.new_slot_start[s], n_w, table + at_entry);
    if (memo != nullptr && n_w > 0) {
      for (int32_t blk = at_entry / CascadeMemo::kBlock;
           blk <= (at_entry + n_w - 1) / CascadeMemo::kBlock; ++blk) {
        memo->written[static_cast<size_t>(blk)] = memo->step;
      }
    }
  }
  auto copy = [&](size_t offset, std::span<const int32_t> v) {
    if (!v.empty()) std::memcpy(at<char>(host, offset), v.data(), v.size() * sizeof(int32_t));
  };
  copy(l.token_ids, batch.token_ids);
  copy(l.positions, batch.positions);
  copy(l.token_start, batch.token_start);
  copy(l.kv_len, batch.kv_len);
  copy(l.slot_start, batch.slot_start);
  copy(l.new_slot_start, batch.new_slot_start);
  copy(l.embed_index, batch.embed_token_index);
  copy(l.embed_row_index, batch.embed_row_index);

  auto* token_slot = at<int32_t>(host, l.token_slot);
  auto* work = at<int32_t>(host, l.work_seqs);
  int32_t n_decode = 0, n_prefill = 0;
  for (int32_t s = 0; s < plan.n_seqs; ++s) {
    const int32_t begin = batch.token_start[s], end = batch.token_start[s + 1];
    for (int32_t t = begin; t < end; ++t) {
      token_slot[t] = table[batch.slot_start[s] + batch.positions[t]];
    }
    if (end - begin == 1) {
      work[n_decode++] = s;
    } else {
      work[plan.n_decode + n_prefill++] = s;
    }
  }
  order_by_first_slot(work, n_decode, batch, table);
  plan.n_cascade_tasks = 0;
  if (plan.cascade_max_tasks > 0 && cascade.members >= 2) {
    plan.n_cascade_tasks =
        plan_cascade(work, n_decode, batch, table, cascade, config.n_kv_heads, memo,
                     at<int32_t>(host, l.cascade_n_tasks), at<int32_t>(host, l.cascade_tasks),
                     at<int32_t>(host, l.cascade_members), at<int32_t>(host, l.cascade_part_start));
  }

  if (plan.dynamic_rope) {
    // Row 0: the base table; a sequence past the original context gets a row of its own.
    const size_t half = static_cast<size_t>(config.head_dim / 2);
    auto* table = at<float>(host, l.freq_table);
    auto* token_row = at<int32_t>(host, l.token_freq_row);
    const std::vector<float> base = rope_inv_freq(config, 0);
    std::copy(base.begin(), base.end(), table);
    int32_t n_rows = 1;
    for (int32_t s = 0; s < plan.n_seqs; ++s) {
      int32_t row = 0;
      if (rope_dynamic_base(config, batch.kv_len[s]) != config.rope.theta) {
        const std::vector<float> inv = rope_inv_freq(config, batch.kv_len[s]);
        std::copy(inv.begin(), inv.end(), table + static_cast<size_t>(n_rows) * half);
        row = n_rows++;
      }
      for (int32_t t = batch.token_start[s]; t < batch.token_start[s + 1]; ++t) token_row[t] = row;
    }
  }

  auto* sample_rows = at<int32_t>(host, l.sample_rows);
  auto* sampling_rows = at<SamplingRow>(host, l.sampling_rows);
  const bool has_history = !batch.history_start.empty();
  for (size_t r = 0; r < plan.sampled_seqs.size(); ++r) {
    const int32_t s = plan.sampled_seqs[r];
    const SamplingParams& sp = batch.sampling[static_cast<size_t>(s)];
    sample_rows[r] = batch.token_start[s + 1] - 1;
    SamplingRow row;
    row.params = sp;
    row.n_generated = batch.n_generated[static_cast<size_t>(s)];
    if (has_history) {
      row.history_begin = batch.history_start[s];
      row.history_end = batch.history_start[s + 1];
      row.n_prompt = batch.n_prompt[static_cast<size_t>(s)];
    }
    sampling_rows[r] = row;
  }
  return Status::ok();
}

}  // namespace litellama
