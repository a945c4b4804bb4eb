#include "services/worker/service/worker_service.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <optional>
#include <set>

#include "common/load_progress.h"
#include "common/log.h"
#include "common/net/service_notify.h"
#include "common/net/zmq_util.h"
#include "common/proto/heartbeat.h"
#include "services/worker/checkpoint.h"

namespace litellama {

namespace {

using net::frame_view;
using net::monotonic_seconds;

constexpr const char* kComputeEndpoint = "inproc://worker-compute";
constexpr const char* kStopCompute = "stop";
// Each report of loading progress gives the service manager this much more time to finish
// starting: a load fails there only when it has stopped making progress.
constexpr std::chrono::seconds kStartTimeoutExtension{120};

prometheus::Histogram::BucketBoundaries step_buckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
          0.1,    0.25,    0.5,    1.0,   2.5,    5.0,   10.0, 30.0};
}

}  // namespace

WorkerService::WorkerService(WorkerOptions options)
    : options_(std::move(options)), registry_(std::make_shared<prometheus::Registry>()) {
  incarnation_ = net::random_id();
  if (options_.step_ring_name.empty()) {
    // The pid alone repeats across restarts in a container (always 1 there), and the scheduler
    // removes a lost worker's ring by name: each incarnation gets a name of its own.
    options_.step_ring_name =
        fmt::format("litellama-step-{}-{:08x}", ::getpid(), incarnation_ & 0xffffffffu);
  }
  auto& r = *registry_;
  step_duration_ = &prometheus::BuildHistogram()
                        .Name("litellama_worker_step_duration_seconds")
                        .Help("Compute time of one step (batch read, forward, sampling)")
                        .Register(r)
                        .Add({}, step_buckets());
  doorbell_latency_ = &prometheus::BuildHistogram()
                           .Name("litellama_worker_doorbell_latency_seconds")
                           .Help(
                               "Scheduler sending a step to the worker starting it (hop "
                               "latency plus queueing behind the running step)")
                           .Register(r)
                           .Add({}, step_buckets());
  steps_ = &prometheus::BuildCounter()
                .Name("litellama_worker_steps_total")
                .Help("Steps run")
                .Register(r)
                .Add({});
  step_errors_ = &prometheus::BuildCounter()
                      .Name("litellama_worker_step_errors_total")
                      .Help("Steps refused or failed")
                      .Register(r)
                      .Add({});
  step_tokens_ = &prometheus::BuildCounter()
                      .Name("litellama_worker_step_tokens_total")
                      .Help("Tokens fed through the model")
                      .Register(r)
                      .Add({});
  protocol_errors_ = &prometheus::BuildCounter()
                          .Name("litellama_worker_protocol_errors_total")
                          .Help("Unknown or malformed messages")
                          .Register(r)
                          .Add({});
  image_handoff_ = &prometheus::BuildHistogram()
                        .Name("litellama_worker_image_handoff_seconds")
                        .Help(
                            "From the vision service completing an image's rows (its clock) to "
                            "this worker launching the first step that reads them")
                        .Register(r)
                        .Add({}, prometheus::Histogram::BucketBoundaries{
                                     1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3,
                                     1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0});
  // Series only a GPU backend writes exist only on one: every exported series can change.
  if (options_.runner.device == Device::kCuda) {
    step_device_duration_ =
        &prometheus::BuildHistogram()
             .Name("litellama_worker_step_device_seconds")
             .Help(
                 "Device time of one step, first copy to last (GPU backends only); the rest of "
                 "the step duration is host work and launch latency")
             .Register(r)
             .Add({}, step_buckets());
    if (options_.runner.use_cuda_graphs) {
      auto& graph_steps = prometheus::BuildCounter()
                              .Name("litellama_worker_graph_steps_total")
                              .Help(
                                  "Steps launched as a CUDA graph: replayed (captured by an "
                                  "earlier step) or captured by this step; the other steps ran "
                                  "eagerly")
                              .Register(r);
      graph_replays_ = &graph_steps.Add({{"kind", "replayed"}});
      graph_captures_ = &graph_steps.Add({{"kind", "captured"}});
    }
    if (options_.runner.decode_cascade) {
      cascade_steps_ = &prometheus::BuildCounter()
                            .Name("litellama_worker_cascade_steps_total")
                            .Help(
                                "Steps whose decode attention read shared prefixes once per group "
                                "of sequences (bf16/fp16 models; float32 never does)")
                            .Register(r)
                            .Add({});
    }
  }
  model_info_ = &prometheus::BuildGauge()
                     .Name("litellama_model_info")
                     .Help("1 for the model this worker serves, once it is loaded")
                     .Register(r);
  weight_bytes_ = &prometheus::BuildGauge()
                       .Name("litellama_worker_weight_bytes")
                       .Help(
                           "Bytes the model's weights take on the worker's device (host memory "
                           "on the CPU backend), labelled with the checkpoint's format")
                       .Register(r);
  kv_slots_capacity_ = &prometheus::BuildGauge()
                            .Name("litellama_worker_kv_slots_capacity")
                            .Help("KV slots of the pool")
                            .Register(r)
                            .Add({});
  scheduler_up_ = &prometheus::BuildGauge()
                       .Name("litellama_worker_scheduler_up")
                       .Help("1 while the scheduler's heartbeats arrive")
                       .Register(r)
                       .Add({});
}

WorkerService::~WorkerService() {
  stop_.store(true);
  if (compute_thread_.joinable()) {
    try {
      net::send_one(compute_io_, kStopCompute);
    } catch (const zmq::error_t&) {
    }
    compute_thread_.join();
  }
  if (ring_registered_) runner_->unregister_host_memory(ring_->data());
}

std::string WorkerService::ready_reason() const {
  if (failed_.load()) return "the model failed to load";
  if (!ready_.load()) return "loading the model";
  if (monotonic_seconds() - last_scheduler_seen_.load() > options_.peer_timeout_ms / 1000.0) {
    return "the scheduler is down";
  }
  if (standby_.load()) return "standby: the scheduler is served by another worker";
  return "";
}

Status WorkerService::start() {
  LITELLAMA_RETURN_IF_ERROR(
      net::check_liveness_flags(options_.heartbeat_interval_ms, options_.peer_timeout_ms));
  LITELLAMA_RETURN_IF_ERROR(
      net::prepare_endpoint(options_.scheduler_endpoint, options_.allow_insecure_tcp));
  try {
    scheduler_ = zmq::socket_t(context_, zmq::socket_type::dealer);
    net::configure_socket(scheduler_);
    scheduler_.set(zmq::sockopt::routing_id, fmt::format("worker-{:016x}", incarnation_));
    scheduler_.connect(options_.scheduler_endpoint);
    compute_io_ = zmq::socket_t(context_, zmq::socket_type::pair);
    compute_io_.set(zmq::sockopt::linger, 0);
    compute_io_.bind(kComputeEndpoint);
  } catch (const zmq::error_t& e) {
    return make_error(StatusCode::kUnavailable, "cannot connect to '{}': {}",
                      options_.scheduler_endpoint, e.what());
  }
  if (!options_.metrics_listen.empty()) {
    LITELLAMA_ASSIGN_OR_RETURN(metrics_,
                               net::MetricsServer::start(options_.metrics_listen, registry_,
                                                         [this] { return ready_reason(); }));
  }
  LITELLAMA_LOG_INFO("worker: scheduler at {}, metrics on {}", options_.scheduler_endpoint,
                     metrics_ ? std::to_string(metrics_->port()) : std::string("(off)"));
  compute_thread_ = std::thread([this] { compute_main(); });
  return Status::ok();
}

Status WorkerService::load() {
  const double start = monotonic_seconds();
  LITELLAMA_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::open(options_.model_dir));
  RunnerOptions runner_options = options_.runner;
  LITELLAMA_ASSIGN_OR_RETURN(runner_options.compute_dtype,
                             resolve_compute_dtype(runner_options.device, options_.dtype,
                                                   checkpoint.config().torch_dtype));
  // Progress on stderr (and to the service manager) as the backend takes each tensor; once every
  // weight is taken, what remains is the KV pool and the workspaces.
  std::vector<int64_t> shard_left = checkpoint.shard_bytes();
  const int64_t total_bytes = std::accumulate(shard_left.begin(), shard_left.end(), int64_t{0});
  LoadProgress progress("weights", total_bytes, static_cast<int32_t>(shard_left.size()),
                        [](const std::string& line) {
                          net::notify_extend_start_timeout(kStartTimeoutExtension, line);
                        });
  std::set<std::string> taken;
  double weights_taken_at = 0.0;
  checkpoint.set_read_observer([&](const TensorView& t) {
    if (!taken.insert(t.name).second) return;
    progress.add(static_cast<int64_t>(t.size_bytes), t.shard);
    int64_t& left = shard_left[static_cast<size_t>(t.shard)];
    left -= static_cast<int64_t>(t.size_bytes);
    if (left == 0) progress.shard_done(t.shard);
    if (progress.done_bytes() == total_bytes) {
      weights_taken_at = monotonic_seconds();
      progress.finish();
      net::notify_extend_start_timeout(kStartTimeoutExtension, "allocating the KV pool");
      std::fprintf(stderr, "allocating the KV pool and workspaces\n");
    }
  });
  LITELLAMA_ASSIGN_OR_RETURN(runner_, create_model_runner(checkpoint, runner_options));
  progress.finish();
  checkpoint.set_read_observer(nullptr);
  const ModelConfig& config = runner_->config();
  const int64_t kv_bytes_per_slot =
      int64_t{2} * config.n_layers * config.n_kv_heads * config.head_dim *
      static_cast<int64_t>(dtype_size_bytes(runner_options.compute_dtype));
  std::fprintf(stderr, "KV pool: %d slots of %s, %s%s, ready %.2f s after the weights\n",
               runner_->n_kv_slots(), format_bytes(kv_bytes_per_slot).c_str(),
               format_bytes(kv_bytes_per_slot * runner_->n_kv_slots()).c_str(),
               runner_options.device == Device::kCpu ? " (pages mapped on first use)" : "",
               weights_taken_at > 0.0 ? monotonic_seconds() - weights_taken_at : 0.0);
  proto::StepRingLimits limits;
  limits.max_tokens = options_.runner.max_batch_tokens;
  limits.max_seqs = options_.runner.max_batch_seqs;
  limits.max_slots = runner_->n_kv_slots();
  limits.max_history = runner_->n_kv_slots();
  limits.table_capacity = runner_->slot_table_capacity();
  // Four image entries per sequence of a full step (at most 2^18: inside the ring's limits). The
  // ring records it, so the scheduler that opens the ring sees the same capacity.
  limits.max_images = 4 * options_.runner.max_batch_seqs;
  LITELLAMA_ASSIGN_OR_RETURN(ring_, proto::StepRing::create(options_.step_ring_name, limits));
  // Image rows are read in place from the vision process's embedding pool, which the reader opens
  // when a step first names it (a device pool: mapped through the runner); its rows must be of
  // the model's hidden size.
  reader_ = RingStepReader(config.hidden_size, runner_.get());
  // Page-locked, so that the runner's copies to the device read the step where it lies; a ring
  // the device cannot register is still read (through staging), so this is not fatal.
  if (Status st = runner_->register_host_memory(ring_->data(), ring_->size_bytes()); st) {
    ring_registered_ = options_.runner.device == Device::kCuda;
  } else {
    LITELLAMA_LOG_WARN("worker: the step ring stays pageable: {}", st.to_string());
  }
  proto::WorkerHeartbeat info;
  info.incarnation = incarnation_;
  info.ready = true;
  info.step_ring_name = options_.step_ring_name;
  info.model = std::filesystem::path(options_.model_dir).filename().string();
  if (info.model.empty()) {
    info.model = std::filesystem::path(options_.model_dir).parent_path().filename().string();
  }
  info.device = options_.runner.device == Device::kCuda ? "cuda" : "cpu";
  info.dtype = dtype_torch_name(runner_options.compute_dtype);
  info.n_kv_slots = runner_->n_kv_slots();
  info.vocab_size = config.vocab_size;
  info.max_position_embeddings = config.max_position_embeddings;
  info.eos_token_ids = config.eos_token_ids;
  // The CPU backend reads a shared-memory pool, the CUDA backend a device pool (a vision service
  // of the same device kind: the scheduler checks).
  info.reads_images = checkpoint.llava() != nullptr &&
                      runner_->supports_input_embeddings(options_.runner.device == Device::kCuda
                                                             ? EmbeddingMemory::kDevice
                                                             : EmbeddingMemory::kHost);
  {
    std::lock_guard<std::mutex> lock(info_mutex_);
    info_ = info;
  }
  kv_slots_capacity_->Set(runner_->n_kv_slots());
  model_info_->Add({{"model", info.model}, {"dtype", info.dtype}, {"device", info.device}}).Set(1);
  const QuantMethod quant = checkpoint.config().quant.method;
  const std::string format = quant == QuantMethod::kNone
                                 ? std::string(dtype_torch_name(checkpoint.config().torch_dtype))
                                 : std::string(quant_method_name(quant));
  weight_bytes_->Add({{"format", format}}).Set(static_cast<double>(runner_->weight_bytes()));
  LITELLAMA_LOG_INFO(
      "worker: loaded {} ({} {}, {} KV slots) in {:.2f} s; weights {} on the {} ({} checkpoint, "
      "{} as stored)",
      info.model, info.device, info.dtype, info.n_kv_slots, monotonic_seconds() - start,
      format_bytes(runner_->weight_bytes()), info.device == "cuda" ? "device" : "host", format,
      format_bytes(total_bytes));
  return Status::ok();
}

void WorkerService::compute_main() {
  zmq::socket_t io(context_, zmq::socket_type::pair);
  io.set(zmq::sockopt::linger, 0);
  io.set(zmq::sockopt::rcvtimeo, 200);
  io.connect(kComputeEndpoint);
  load_status_ = load();
  if (!load_status_) {
    failed_.store(true);
    net::notify_status(load_status_.to_string());
  } else {
    ready_.store(true);
    // Ready by itself: whether the scheduler is up is what /ready reports.
    net::notify_ready("serving " + info_.model);
  }
  while (!stop_.load()) {
    zmq::message_t msg;
    auto got = io.recv(msg, zmq::recv_flags::none);
    if (!got) continue;
    const std::string bytes(frame_view(msg));
    if (bytes == kStopCompute) break;
    const std::string result = run_step(bytes);
    io.send(zmq::buffer(result), zmq::send_flags::none);
  }
}

void WorkerService::write_top_logits(const StepOutput& output, int32_t n_top_logits,
                                     const proto::StepView& view) {
  const size_t k = static_cast<size_t>(n_top_logits);
  for (size_t s = 0; s < output.top_logits.size(); ++s) {
    const auto& top = output.top_logits[s];
    const size_t base = s * proto::kMaxStepTopLogits;
    for (size_t i = 0; i < k; ++i) {
      view.top_ids[base + i] = i < top.size() ? top[i].first : -1;
      view.top_values[base + i] = i < top.size() ? top[i].second : 0.0f;
    }
  }
}

std::string WorkerService::run_step(const std::string& doorbell_bytes) {
  proto::StepResult result;
  auto request = proto::decode<proto::StepRequest>(doorbell_bytes);
  if (!request) {
    result.error = request.status().to_string();
    return proto::encode(result);
  }
  result.step_id = request->step_id;
  if (request->sent_unix_ns > 0) {
    doorbell_latency_->Observe(std::max<int64_t>(0, net::unix_now_ns() - request->sent_unix_ns) *
                               1e-9);
  }
  auto fail = [&](const Status& st) {
    step_errors_->Increment();
    previous_sampled_.clear();
    reader_.invalidate();
    result.ok = false;
    result.error = st.to_string();
    LITELLAMA_LOG_ERROR("worker: step {} failed: {}", request->step_id, result.error);
    return proto::encode(result);
  };
  if (!ready_.load() || !ring_) {
    return fail(Status(StatusCode::kUnavailable, "the model is not loaded"));
  }
  if (request->incarnation != incarnation_) {
    return fail(Status(StatusCode::kInvalidArgument, "step planned for another worker"));
  }
  if (request->buffer < 0 || request->buffer >= proto::kStepRingBuffers) {
    return fail(Status(StatusCode::kInvalidArgument, "no such step buffer"));
  }
  const double start = monotonic_seconds();
  proto::StepView view = ring_->buffer(request->buffer);
  if (Status st = reader_.read(view, ring_->limits(), previous_sampled_, ring_registered_, &batch_);
      !st) {
    return fail(st);
  }
  // The image hand-off: measured by the runner on the GPU's clock where the rows are in device
  // memory of this GPU (the vision service announces them before its stream has written them);
  // otherwise from the vision service's host clock (both processes share a host) to here.
  std::optional<double> host_handoff;
  if (const int64_t ready = view.header->images_ready_unix_ns; ready > 0) {
    host_handoff = static_cast<double>(std::max<int64_t>(0, net::unix_now_ns() - ready)) * 1e-9;
  }
  if (Status st = runner_->step(batch_, &output_); !st) return fail(st);
  if (const auto device = runner_->last_image_handoff_seconds()) {
    image_handoff_->Observe(*device);
  } else if (host_handoff) {
    image_handoff_->Observe(*host_handoff);
  }
  const size_t n = output_.sampled_ids.size();
  std::copy(output_.sampled_ids.begin(), output_.sampled_ids.end(), view.sampled_ids.begin());
  previous_sampled_.assign(output_.sampled_ids.begin(), output_.sampled_ids.begin() + n);
  if (batch_.n_top_logits > 0) write_top_logits(output_, batch_.n_top_logits, view);
  if (batch_.logprobs) {
    const size_t n_lp = std::min(output_.logprobs.size(), n);
    std::copy_n(output_.logprobs.begin(), n_lp, view.logprobs.begin());
    std::copy_n(output_.lse.begin(), std::min(output_.lse.size(), n), view.lse.begin());
  }
  result.ok = true;
  step_duration_->Observe(monotonic_seconds() - start);
  if (const auto device = runner_->last_step_device_seconds(); device && step_device_duration_) {
    step_device_duration_->Observe(*device);
  }
  steps_->Increment();
  step_tokens_->Increment(static_cast<double>(batch_.n_tokens()));
  // The runner's running counts, as increments of the counters.
  auto add_new = [](prometheus::Counter* counter, int64_t now, int64_t* seen) {
    if (now > *seen && counter != nullptr) counter->Increment(static_cast<double>(now - *seen));
    *seen = std::max(*seen, now);
  };
  add_new(graph_replays_, runner_->graph_replays(), &graph_replays_seen_);
  add_new(graph_captures_, runner_->graph_captures(), &graph_captures_seen_);
  add_new(cascade_steps_, runner_->cascade_steps(), &cascade_steps_seen_);
  return proto::encode(result);
}

proto::WorkerHeartbeat WorkerService::heartbeat() const {
  if (ready_.load()) {
    std::lock_guard<std::mutex> lock(info_mutex_);
    return info_;
  }
  proto::WorkerHeartbeat hb;
  hb.incarnation = incarnation_;
  hb.ready = false;
  return hb;
}

Status WorkerService::run() {
  std::vector<zmq::message_t> frames;
  double last_heartbeat = 0.0;
  while (!stop_.load()) {
    if (failed_.load()) {
      stop_.store(true);
      break;
    }
    const double now = monotonic_seconds();
    if (now - last_heartbeat >= options_.heartbeat_interval_ms / 1000.0) {
      last_heartbeat = now;
      (void)net::send_one(scheduler_, proto::encode(heartbeat()));
      const double silent = monotonic_seconds() - last_scheduler_seen_.load();
      scheduler_up_->Set(silent <= options_.peer_timeout_ms / 1000.0 ? 1 : 0);
    }
    net::wait_readable({&scheduler_, &compute_io_},
                       std::max(1, options_.heartbeat_interval_ms / 2));
    // Results first: the scheduler is waiting on them.
    net::forward_waiting(compute_io_, scheduler_, &frames);
    while (net::recv_frames(scheduler_, &frames)) {
      auto envelope = net::parse_one_frame(frames);
      if (!envelope) {
        protocol_errors_->Increment();
        LITELLAMA_LOG_WARN("worker: dropped a message: {}", envelope.status().to_string());
        continue;
      }
      switch (envelope->type()) {
        case proto::MessageType::kSchedulerHeartbeat:
          if (auto hb = envelope->as<proto::SchedulerHeartbeat>()) {
            last_scheduler_seen_.store(monotonic_seconds());
            if (hb->standby != standby_.exchange(hb->standby)) {
              if (hb->standby) {
                LITELLAMA_LOG_WARN(
                    "worker: the scheduler already has a worker; this one is standby until that "
                    "one is gone");
              } else {
                LITELLAMA_LOG_INFO("worker: the scheduler serves through this worker now");
              }
            }
          } else {
            protocol_errors_->Increment();
          }
          break;
        case proto::MessageType::kStepRequest:
          last_scheduler_seen_.store(monotonic_seconds());
          // The scheduler steps only its serving worker: a step ends standby at once, before
          // the next heartbeat says so, so /ready never reports standby while this one serves.
          if (standby_.exchange(false)) {
            LITELLAMA_LOG_INFO("worker: the scheduler serves through this worker now");
          }
          // The compute thread decodes it; steps queue there in order.
          (void)compute_io_.send(frames[0], zmq::send_flags::none);
          break;
        default:
          protocol_errors_->Increment();
          LITELLAMA_LOG_WARN("worker: dropped an unexpected '{}' message",
                             proto::message_type_name(envelope->type()));
      }
    }
  }
  (void)net::send_one(compute_io_, kStopCompute);
  if (compute_thread_.joinable()) compute_thread_.join();
  if (failed_.load()) return load_status_;
  LITELLAMA_LOG_INFO("worker: stopped");
  return Status::ok();
}

}  // namespace litellama
