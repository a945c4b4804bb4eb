// The scheduler's side of images (LLaVA): the vision peer, the placing of each image in its
// request's prompt, and the encodes that must finish before the request may be admitted.
//
// A request with images is in state kImages from the moment its ids are known until every one of
// its images is in the vision service's pool: an image already held (by another request or
// cached) is not encoded again (ImageTable, keyed by the hash of the bytes); otherwise a slot is
// assigned and the image sent. The request holds a reference on each of its slots until it ends,
// so that a preempted request recomputes from rows that are still there. The vision process
// dying or being replaced fails the requests that still need its rows: those waiting for their
// images and those whose KV does not cover them yet. The others run on; one that a preemption
// later makes need the rows again (its prefix no longer cached) fails then.
#include <algorithm>

#include "common/image_token_runs.h"
#include "common/log.h"
#include "common/net/zmq_util.h"
#include "services/scheduler/scheduler_service.h"
#include "services/vision/embedding_pool.h"

namespace litellama {

namespace {

using net::frame_view;
using net::monotonic_seconds;
using net::SendResult;

}  // namespace

void SchedulerService::start_generation(Request* r) {
  r->detok_prefix = std::max(0, r->n_prompt() - kDetokenizeContext);
  r->detok_read = r->n_prompt();
  if (r->images.empty()) {
    batcher_.enqueue(r);
    return;
  }
  if (!place_images(r)) return;
  r->detok_prefix = std::max(0, r->n_prompt() - kDetokenizeContext);
  r->detok_read = r->n_prompt();
  r->state = RequestState::kImages;
  r->t_images = monotonic_seconds();
  image_waiters_.push_back(r->id);
  advance_images(r);
}

bool SchedulerService::place_images(Request* r) {
  if (!vision_peer_) {
    fail(r, StatusCode::kUnavailable,
         "the request has images but no vision service is up (images need litellama-vision "
         "and a LLaVA model)");
    return false;
  }
  if (worker_ && !worker_->info.reads_images) {
    fail(r, StatusCode::kUnsupported,
         fmt::format("the request has images but the worker ({} on {}) reads none: it does not "
                     "serve a LLaVA model",
                     worker_->info.model, worker_->info.device));
    return false;
  }
  // A CPU worker reads a shared-memory pool, a CUDA worker a device pool.
  if (worker_ && (worker_->info.device == "cpu") != (vision_peer_->info.device == "cpu")) {
    fail(r, StatusCode::kUnsupported,
         fmt::format("the request has images but the vision service runs on {} and the worker "
                     "on {}: both must run on the CPU or both on the GPU",
                     vision_peer_->info.device, worker_->info.device));
    return false;
  }
  const int32_t token = vision_peer_->info.image_token_id;
  const int32_t rows = vision_peer_->info.rows_per_slot;
  if (static_cast<int32_t>(r->images.size()) > vision_peer_->info.n_slots) {
    fail(r, StatusCode::kInvalidArgument,
         fmt::format("the request has {} images but the vision pool holds {} "
                     "(--vision-pool-bytes)",
                     r->images.size(), vision_peer_->info.n_slots));
    return false;
  }
  // Runs of the image token: each is one image, already expanded to the image's token count
  // (by the tokenizer for a text or chat prompt, or by the client) or written once (client ids,
  // or a tokenizer that does not expand): expanded here.
  auto runs = expand_image_token_runs(r->prompt_ids, token, rows, r->images.size());
  if (!runs) {
    fail(r, StatusCode::kInvalidArgument, runs.status().message());
    return false;
  }
  for (size_t i = 0; i < r->images.size(); ++i) r->images[i].pos = runs->image_positions[i];
  r->prompt_ids = std::move(runs->prompt_ids);
  r->image_rows = rows;
  return true;
}

void SchedulerService::advance_images(Request* r) {
  if (!vision_peer_) return;
  // All or nothing: a request takes slots only when every image it still needs fits, so that
  // two requests holding part of what they need can never wait on each other. Images already
  // held come first (taking them never evicts), then new ones (which may evict cached slots,
  // never this request's own: those are referenced by then).
  int32_t n_new = 0;
  int32_t n_own_cached = 0;
  std::vector<uint64_t> counted;
  for (const RequestImage& image : r->images) {
    if (image.acquired || std::find(counted.begin(), counted.end(), image.hash) != counted.end()) {
      continue;
    }
    counted.push_back(image.hash);
    if (!image_table_.slot_of(image.hash)) {
      ++n_new;
    } else if (image_table_.refcount(image.hash) == 0 && image_table_.is_ready(image.hash)) {
      ++n_own_cached;
    }
  }
  if (n_new > image_table_.n_free() + image_table_.n_cached() - n_own_cached) return;
  std::vector<RequestImage*> order;
  for (RequestImage& image : r->images) {
    if (!image.acquired && image_table_.slot_of(image.hash)) order.push_back(&image);
  }
  for (RequestImage& image : r->images) {
    if (!image.acquired && !image_table_.slot_of(image.hash)) order.push_back(&image);
  }
  for (RequestImage* held : order) {
    RequestImage& image = *held;
    if (image.acquired) continue;
    const auto got = image_table_.acquire(image.hash);
    if (!got) return;  // no slot free: on_tick tries again
    image.acquired = true;
    image.slot = got->slot;
    image.ready = got->ready;
    (got->needs_encode ? metrics_data_.images_encoded : metrics_data_.images_reused)->Increment();
    if (!got->needs_encode) {
      image.bytes.clear();
      image.bytes.shrink_to_fit();
      continue;
    }
    proto::EncodeImageRequest request;
    request.op_id = next_vision_op_++;
    request.image_hash = image.hash;
    request.slot = got->slot;
    request.sent_unix_ns = net::unix_now_ns();
    vision_ops_[request.op_id] = {image.hash, monotonic_seconds()};
    const std::string head = proto::encode(request);
    bool sent = false;
    try {
      sent = vision_
                 .send(zmq::buffer(vision_peer_->identity),
                       zmq::send_flags::sndmore | zmq::send_flags::dontwait)
                 .has_value() &&
             vision_.send(zmq::buffer(head), zmq::send_flags::sndmore | zmq::send_flags::dontwait)
                 .has_value() &&
             vision_.send(zmq::buffer(image.bytes), zmq::send_flags::dontwait).has_value();
    } catch (const zmq::error_t&) {
      sent = false;
    }
    image.bytes.clear();
    image.bytes.shrink_to_fit();
    if (!sent) {
      vision_lost("unreachable", true);
      return;
    }
  }
  if (std::all_of(r->images.begin(), r->images.end(),
                  [](const RequestImage& i) { return i.ready; })) {
    image_waiters_.erase(std::remove(image_waiters_.begin(), image_waiters_.end(), r->id),
                         image_waiters_.end());
    batcher_.enqueue(r);
  }
}

void SchedulerService::release_images(Request* r) {
  for (RequestImage& image : r->images) {
    if (image.acquired) image_table_.release(image.hash);
    image.acquired = false;
  }
  image_waiters_.erase(std::remove(image_waiters_.begin(), image_waiters_.end(), r->id),
                       image_waiters_.end());
}

void SchedulerService::on_vision_frames(std::vector<zmq::message_t>& frames) {
  if (frames.size() != 2) {
    protocol_error("vision", Status(StatusCode::kInvalidArgument, "expected 1 frame"));
    return;
  }
  const std::string identity(frame_view(frames[0]));
  auto envelope = proto::Envelope::parse(frame_view(frames[1]));
  if (!envelope) return protocol_error("vision", envelope.status());
  if (vision_peer_ && vision_peer_->identity == identity) {
    vision_peer_->last_seen = monotonic_seconds();
  }
  switch (envelope->type()) {
    case proto::MessageType::kVisionHeartbeat: {
      auto hb = envelope->as<proto::VisionHeartbeat>();
      if (!hb) return protocol_error("vision", hb.status());
      on_vision_heartbeat(identity, *hb);
      return;
    }
    case proto::MessageType::kEncodeImageReply: {
      auto reply = envelope->as<proto::EncodeImageReply>();
      if (!reply) return protocol_error("vision", reply.status());
      if (vision_peer_ && vision_peer_->identity == identity) on_encode_image_reply(*reply);
      return;
    }
    default:
      protocol_error("vision", Status(StatusCode::kInvalidArgument,
                                      fmt::format("unexpected '{}' message",
                                                  proto::message_type_name(envelope->type()))));
  }
}

void SchedulerService::on_vision_heartbeat(const std::string& identity,
                                           const proto::VisionHeartbeat& hb) {
  if (vision_peer_ && vision_peer_->info.incarnation == hb.incarnation) {
    vision_peer_->last_seen = monotonic_seconds();
    return;
  }
  if (hb.n_slots < 1 || hb.rows_per_slot < 1 || hb.hidden < 1 || hb.image_token_id < 0 ||
      hb.pool_name.empty() || hb.pool_name.size() >= proto::kVisionPoolNameBytes) {
    protocol_error("vision", make_error(StatusCode::kInvalidArgument,
                                        "a vision heartbeat with an unusable pool ('{}', {} "
                                        "slots of {} x {})",
                                        hb.pool_name, hb.n_slots, hb.rows_per_slot, hb.hidden));
    return;
  }
  if (vision_peer_) vision_lost("replaced by a new vision process", true);
  vision_peer_ = std::make_unique<VisionPeer>();
  vision_peer_->identity = identity;
  vision_peer_->info = hb;
  vision_peer_->last_seen = monotonic_seconds();
  image_table_.reset(hb.n_slots);
  batcher_.set_vision(hb.pool_name, hb.incarnation, hb.rows_per_slot);
  LITELLAMA_LOG_INFO("scheduler: vision up ({} on {}, pool '{}' of {} slots of {} image tokens)",
                     hb.model, hb.device, hb.pool_name, hb.n_slots, hb.rows_per_slot);
}

void SchedulerService::on_encode_image_reply(const proto::EncodeImageReply& reply) {
  auto op = vision_ops_.find(reply.op_id);
  if (op == vision_ops_.end()) return;
  const uint64_t hash = op->second.image_hash;
  vision_ops_.erase(op);
  const bool ok = reply.error.empty() && reply.n_rows == vision_peer_->info.rows_per_slot;
  if (ok) {
    image_table_.mark_ready(hash);
  } else {
    image_table_.mark_failed(hash);
  }
  // Every request waiting on this image learns the outcome.
  for (uint64_t id : std::vector<uint64_t>(image_waiters_.begin(), image_waiters_.end())) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    Request* r = it->second.get();
    bool mine = false;
    for (RequestImage& image : r->images) {
      if (image.acquired && image.hash == hash && !image.ready) {
        mine = true;
        if (ok) {
          image.ready = true;
          image.ready_unix_ns = reply.finished_unix_ns;
        }
      }
    }
    if (!mine) continue;
    if (!ok) {
      const std::string why = reply.error.empty()
                                  ? fmt::format("the vision service wrote {} rows, not {}",
                                                reply.n_rows, vision_peer_->info.rows_per_slot)
                                  : reply.error;
      fail(r, reply.bad_image ? StatusCode::kInvalidArgument : StatusCode::kInternal,
           "an image of the request could not be used: " + why);
      continue;
    }
    advance_images(r);
  }
}

void SchedulerService::vision_lost(const char* why, bool gone) {
  if (!vision_peer_) return;
  LITELLAMA_LOG_WARN("scheduler: vision service lost ({}); requests that need its rows fail", why);
  // A process that died left its shared-memory pool behind (a clean stop removes it); a worker
  // that still maps it keeps its mapping. One that is only silent may come back with it.
  // A device pool's region holds its header; its rows went with the process.
  if (gone) EmbeddingPool::remove(vision_peer_->info.pool_name);
  vision_peer_.reset();
  vision_ops_.clear();
  // Requests still waiting for their images, or admitted with KV that does not cover them yet,
  // need rows the new process will not hold: they fail. Those whose KV covers their images run
  // on (the batcher fails one that a preemption makes need them again).
  std::vector<Request*> doomed;
  for (auto& [id, owned] : requests_) {
    Request* r = owned.get();
    if (r->images.empty() || r->finish) continue;
    for (RequestImage& image : r->images) image.acquired = false;  // the table goes below
    r->images_lost = true;
    int32_t end = 0;
    for (const RequestImage& image : r->images) end = std::max(end, image.pos + r->image_rows);
    if (r->state == RequestState::kImages || r->state == RequestState::kWaiting || r->n_fed < end) {
      doomed.push_back(r);
    }
  }
  for (Request* r : doomed) {
    fail(r, StatusCode::kUnavailable,
         "the vision service stopped before the request's images were read");
  }
  image_table_.reset(0);
  batcher_.set_vision("", 0, 0);
}

}  // namespace litellama
