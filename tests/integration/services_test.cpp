// The three processes over ZeroMQ: outputs equal the offline engine's, aborts free slots, peers
// that die are survived, malformed frames are counted, metrics add up.
#include <sys/wait.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <unordered_map>

#include <gtest/gtest.h>
#include <msgpack.hpp>
#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include "common/proto/client_messages.h"
#include "common/proto/tokenizer_messages.h"
#include "common/proto/worker_messages.h"
#include "services/tokenizer/tokenizer.h"
#include "services/worker/checkpoint.h"
#include "services/worker/offline_engine.h"
#include "tests/integration/service_cluster.h"
#include "tests/support/raw_message.h"

namespace litellama {
namespace {

using testing::metric_value;
using testing::ServiceCluster;

struct Stream {
  std::vector<int32_t> ids;
  std::string text;
  std::string finish_reason;
  bool error = false;
  bool done = false;
  size_t n_chunks = 0;
  std::vector<std::pair<int32_t, float>> top_logits;
  size_t n_chunks_with_top_logits = 0;
  std::vector<float> logprobs;
  std::vector<std::vector<std::pair<int32_t, float>>> top_logprobs;
  std::vector<std::vector<std::string>> pieces;
  bool logprobs_aligned = true;  // every chunk's logprobs line up with its ids
};

// Runs every outstanding request of `client` to its end.
std::unordered_map<uint64_t, Stream> collect(net::SchedulerClient& client,
                                             const std::vector<uint64_t>& ids,
                                             int timeout_ms = 60000) {
  std::unordered_map<uint64_t, Stream> streams;
  for (uint64_t id : ids) streams[id];
  size_t n_done = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (n_done < ids.size() && std::chrono::steady_clock::now() < deadline) {
    auto event = client.next_event(100);
    if (!event.is_ok() || !*event) continue;
    auto it = streams.find((*event)->request_id());
    if (it == streams.end() || it->second.done) continue;
    Stream& s = it->second;
    if ((*event)->kind == net::ClientEvent::Kind::kError) {
      s.error = true;
      s.done = true;
      ++n_done;
      continue;
    }
    const auto& chunk = (*event)->chunk;
    ++s.n_chunks;
    s.ids.insert(s.ids.end(), chunk.token_ids.begin(), chunk.token_ids.end());
    s.text += chunk.text;
    if (!chunk.logprobs.empty() || !chunk.top_logprobs.empty() || !chunk.pieces.empty()) {
      s.logprobs_aligned = s.logprobs_aligned && chunk.logprobs.size() == chunk.token_ids.size() &&
                           chunk.top_logprobs.size() == chunk.token_ids.size() &&
                           chunk.pieces.size() == chunk.token_ids.size();
      s.logprobs.insert(s.logprobs.end(), chunk.logprobs.begin(), chunk.logprobs.end());
      s.top_logprobs.insert(s.top_logprobs.end(), chunk.top_logprobs.begin(),
                            chunk.top_logprobs.end());
      s.pieces.insert(s.pieces.end(), chunk.pieces.begin(), chunk.pieces.end());
    }
    if (!chunk.top_logits.empty()) {
      EXPECT_EQ(s.ids.size(), chunk.token_ids.size())
          << "top logits not on the first token's chunk";
      s.top_logits = chunk.top_logits;
      ++s.n_chunks_with_top_logits;
    }
    if (chunk.finished) {
      s.finish_reason = chunk.finish_reason;
      s.done = true;
      ++n_done;
    }
  }
  return streams;
}

// Submits every request from `client` and runs them to their end; their streams in request
// order. A refused submission fails the test and leaves its stream empty (not done).
std::vector<Stream> serve_all(net::SchedulerClient& client,
                              const std::vector<proto::GenerateRequest>& requests) {
  std::vector<std::optional<uint64_t>> ids;
  std::vector<uint64_t> accepted;
  for (const auto& r : requests) {
    auto id = client.submit(r);
    EXPECT_TRUE(id.is_ok()) << id.status().to_string();
    ids.push_back(id.is_ok() ? std::optional<uint64_t>(*id) : std::nullopt);
    if (id.is_ok()) accepted.push_back(*id);
  }
  auto got = collect(client, accepted);
  std::vector<Stream> streams;
  for (const auto& id : ids) streams.push_back(id ? got[*id] : Stream{});
  return streams;
}

std::vector<GenerationResult> offline_reference(const std::string& model_dir,
                                                const std::vector<GenerationRequest>& requests) {
  auto ckpt = Checkpoint::open(model_dir);
  EXPECT_TRUE(ckpt.is_ok());
  RunnerOptions options;
  options.n_kv_slots = 4096;
  options.n_threads = 1;
  auto runner = create_model_runner(*ckpt, options);
  EXPECT_TRUE(runner.is_ok());
  OfflineEngine engine(**runner);
  auto results = engine.generate(requests);
  EXPECT_TRUE(results.is_ok()) << results.status().to_string();
  return std::move(results).value();
}

TEST(ServicesIntegration, ConcurrentStreamsMatchOfflineEngine) {
  ServiceCluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.start_all());
  auto tok = Tokenizer::load(cluster.model_dir());
  ASSERT_TRUE(tok.is_ok());

  // Mixed prompt lengths (odd ones included) and output lengths, all in flight together.
  std::mt19937 rng(3);
  const int kRequests = 16;
  std::vector<GenerationRequest> reference(kRequests);
  std::vector<proto::GenerateRequest> requests(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    const int n_prompt = i % 4 == 0 ? 1 : 3 + static_cast<int>(rng() % 60);
    for (int k = 0; k < n_prompt; ++k) {
      reference[i].prompt_ids.push_back(static_cast<int32_t>(rng() % 120000));
    }
    reference[i].max_new_tokens = 1 + static_cast<int>(rng() % 24);
    requests[i].prompt_ids = reference[i].prompt_ids;
    requests[i].max_tokens = reference[i].max_new_tokens;
    requests[i].ignore_eos = true;
  }
  // Two text prompts through the tokenizer as well.
  for (int i : {5, 9}) {
    const std::string text = i == 5 ? "The quick brown fox" : "Bonjour, ça va? 你好";
    requests[i].prompt_ids.clear();
    requests[i].prompt = text;
    reference[i].prompt_ids = tok->encode(text, true);
  }
  const auto expected = offline_reference(cluster.model_dir(), reference);

  // Two clients, interleaved submissions.
  auto a = cluster.client();
  auto b = cluster.client();
  std::vector<uint64_t> ids_a, ids_b;
  std::vector<std::pair<int, uint64_t>> which;
  for (int i = 0; i < kRequests; ++i) {
    auto& c = i % 2 ? b : a;
    auto id = c->submit(requests[i]);
    ASSERT_TRUE(id.is_ok());
    (i % 2 ? ids_b : ids_a).push_back(*id);
    which.push_back({i % 2, *id});
  }
  auto got_a = collect(*a, ids_a);
  auto got_b = collect(*b, ids_b);
  for (int i = 0; i < kRequests; ++i) {
    const Stream& s = (which[i].first ? got_b : got_a)[which[i].second];
    ASSERT_TRUE(s.done) << "request " << i << " got no answer\n" << cluster.logs();
    ASSERT_FALSE(s.error) << "request " << i;
    EXPECT_EQ(s.ids, expected[i].output_ids) << "request " << i;
    EXPECT_EQ(s.finish_reason, "length") << "request " << i;
    EXPECT_EQ(s.text, tok->decode(expected[i].output_ids, true)) << "request " << i;
  }
  EXPECT_TRUE(cluster.wait_metric("litellama_scheduler_kv_slots_used", 0));
}

void expect_top_logits_near(const std::vector<std::pair<int32_t, float>>& got,
                            const std::vector<std::pair<int32_t, float>>& want,
                            const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t k = 0; k < want.size(); ++k) {
    EXPECT_EQ(got[k].first, want[k].first) << what << " rank " << k;
    EXPECT_LE(std::abs(got[k].second - want[k].second),
              1e-4f * std::max(1.0f, std::abs(want[k].second)))
        << what << " rank " << k << ": " << got[k].second << " vs " << want[k].second;
  }
}

// Logprobs through the services (ring, scheduler, chunks) equal the offline engine's for every
// generated token, greedy and sampled with penalties side by side in one step, and each token's
// piece is its id decoded alone (the ids' pieces spell the text when it is plain).
TEST(ServicesIntegration, LogprobsOfEveryTokenMatchOfflineEngine) {
  ServiceCluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.start_all());
  const std::vector<int32_t> n_top = {3, 0, 5, -1};  // -1: no logprobs
  std::vector<GenerationRequest> reference(n_top.size());
  std::vector<proto::GenerateRequest> requests(n_top.size());
  std::mt19937 rng(23);
  for (size_t i = 0; i < n_top.size(); ++i) {
    const int n_prompt = 2 + static_cast<int>(rng() % 30);
    for (int k = 0; k < n_prompt; ++k) {
      reference[i].prompt_ids.push_back(static_cast<int32_t>(rng() % 120000));
    }
    reference[i].max_new_tokens = 6;
    if (i == 2) {
      reference[i].sampling.temperature = 1.3f;
      reference[i].sampling.repetition_penalty = 1.4f;
      reference[i].sampling.seed = 9;
    }
    reference[i].logprobs = n_top[i] >= 0;
    reference[i].n_top_logprobs = std::max(0, n_top[i]);
    requests[i].prompt_ids = reference[i].prompt_ids;
    requests[i].max_tokens = reference[i].max_new_tokens;
    requests[i].ignore_eos = true;
    requests[i].sampling.temperature = reference[i].sampling.temperature;
    requests[i].sampling.repetition_penalty = reference[i].sampling.repetition_penalty;
    requests[i].sampling.seed = reference[i].sampling.seed;
    requests[i].logprobs = reference[i].logprobs;
    requests[i].top_logprobs = reference[i].n_top_logprobs;
  }
  const auto expected = offline_reference(cluster.model_dir(), reference);
  auto c = cluster.client();
  const std::vector<Stream> got = serve_all(*c, requests);
  for (size_t i = 0; i < n_top.size(); ++i) {
    const Stream& s = got[i];
    const std::string what = "request " + std::to_string(i);
    ASSERT_TRUE(s.done && !s.error) << what << "\n" << cluster.logs();
    EXPECT_EQ(s.ids, expected[i].output_ids) << what;
    if (n_top[i] < 0) {
      EXPECT_TRUE(s.logprobs.empty() && s.top_logprobs.empty()) << what;
      continue;
    }
    EXPECT_TRUE(s.logprobs_aligned) << what;
    ASSERT_EQ(s.logprobs.size(), expected[i].logprobs.size()) << what;
    ASSERT_EQ(s.top_logprobs.size(), expected[i].top_logprobs.size()) << what;
    for (size_t t = 0; t < s.logprobs.size(); ++t) {
      EXPECT_NEAR(s.logprobs[t], expected[i].logprobs[t], 1e-4) << what << " token " << t;
      EXPECT_LE(s.logprobs[t], 0.0f);
      ASSERT_EQ(s.top_logprobs[t].size(), static_cast<size_t>(n_top[i])) << what;
      for (size_t k = 0; k < s.top_logprobs[t].size(); ++k) {
        EXPECT_EQ(s.top_logprobs[t][k].first, expected[i].top_logprobs[t][k].first) << what;
        EXPECT_NEAR(s.top_logprobs[t][k].second, expected[i].top_logprobs[t][k].second, 1e-4);
      }
      ASSERT_EQ(s.pieces[t].size(), 1u + n_top[i]) << what << " token " << t;
    }
  }

  // top_logprobs without logprobs, or past 20, is refused naming the field.
  proto::GenerateRequest bad = requests[0];
  bad.logprobs = false;
  auto refused = c->generate(bad, nullptr, 30000);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("top_logprobs"), std::string::npos);
  bad.logprobs = true;
  bad.top_logprobs = proto::kMaxTopLogprobs + 1;
  refused = c->generate(bad, nullptr, 30000);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("top_logprobs"), std::string::npos);
}

TEST(ServicesIntegration, TopLogitsOfTheFirstTokenMatchOfflineEngine) {
  ServiceCluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.start_all());

  // Mixed prompt lengths in flight together; request 2 asks for none, request 3 for one.
  const std::vector<int32_t> n_top = {5, 5, 0, 1};
  std::vector<GenerationRequest> reference(n_top.size());
  std::vector<proto::GenerateRequest> requests(n_top.size());
  std::mt19937 rng(11);
  for (size_t i = 0; i < n_top.size(); ++i) {
    const int n_prompt = i == 0 ? 1 : 3 + static_cast<int>(rng() % 40);
    for (int k = 0; k < n_prompt; ++k) {
      reference[i].prompt_ids.push_back(static_cast<int32_t>(rng() % 120000));
    }
    reference[i].max_new_tokens = 3 + static_cast<int>(i);
    reference[i].n_top_logits = n_top[i];
    requests[i].prompt_ids = reference[i].prompt_ids;
    requests[i].max_tokens = reference[i].max_new_tokens;
    requests[i].ignore_eos = true;
    requests[i].top_logits = n_top[i];
  }
  const auto expected = offline_reference(cluster.model_dir(), reference);

  auto c = cluster.client();
  const std::vector<Stream> got = serve_all(*c, requests);
  for (size_t i = 0; i < n_top.size(); ++i) {
    const Stream& s = got[i];
    ASSERT_TRUE(s.done) << "request " << i << " got no answer\n" << cluster.logs();
    ASSERT_FALSE(s.error) << "request " << i;
    EXPECT_EQ(s.ids, expected[i].output_ids) << "request " << i;
    EXPECT_EQ(s.n_chunks_with_top_logits, n_top[i] > 0 ? 1u : 0u) << "request " << i;
    ASSERT_EQ(expected[i].top_logits.size(), static_cast<size_t>(n_top[i]));
    expect_top_logits_near(s.top_logits, expected[i].top_logits, "request " + std::to_string(i));
  }

  // More than the sampler can return is refused, with a message that names the field.
  proto::GenerateRequest too_many = requests[0];
  too_many.top_logits = proto::kMaxTopLogits + 1;
  auto refused = c->generate(too_many, nullptr, 30000);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(), "top_logits must be in [0, 64]");

  // The CLI against the server prints what the offline CLI prints.
  auto run_json = [&](const std::vector<std::string>& argv, const std::string& name) {
    const auto log = cluster.dir() / (name + ".out");
    auto child = net::ChildProcess::spawn(argv, log.string());
    EXPECT_TRUE(child.is_ok());
    std::optional<int> code;
    for (int i = 0; i < 1500 && !code; ++i) {
      code = child->poll();
      if (!code) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!code) child->stop(2000);
    std::ifstream in(log);
    std::stringstream ss;
    ss << in.rdbuf();
    EXPECT_EQ(code.value_or(-1), 0) << ss.str();
    return nlohmann::json::parse(ss.str(), nullptr, false);
  };
  const std::vector<std::string> common_args = {
      "--input-ids", "9,8,7,6", "--max-new-tokens", "2", "--top-logits", "5", "--json"};
  std::vector<std::string> remote = {cluster.bin_dir() + "/litellama", "generate", "--server",
                                     (cluster.dir() / "run").string()};
  std::vector<std::string> offline = {cluster.bin_dir() + "/litellama",
                                      "generate",
                                      "--model",
                                      cluster.model_dir(),
                                      "--device",
                                      "cpu",
                                      "--threads",
                                      "1"};
  remote.insert(remote.end(), common_args.begin(), common_args.end());
  offline.insert(offline.end(), common_args.begin(), common_args.end());
  const auto served = run_json(remote, "cli-remote");
  const auto local = run_json(offline, "cli-offline");
  ASSERT_TRUE(served.is_object() && local.is_object()) << served.dump() << "\n" << local.dump();
  EXPECT_EQ(served["output_ids"], local["output_ids"]);
  ASSERT_TRUE(served["top_logits"].is_array()) << served.dump();
  ASSERT_EQ(served["top_logits"].size(), 5u) << served.dump();
  std::vector<std::pair<int32_t, float>> served_top, local_top;
  for (const auto& p : served["top_logits"]) served_top.emplace_back(p[0], p[1]);
  for (const auto& p : local["top_logits"]) local_top.emplace_back(p[0], p[1]);
  expect_top_logits_near(served_top, local_top, "cli");
  EXPECT_TRUE(cluster.wait_metric("litellama_scheduler_kv_slots_used", 0));
}

TEST(ServicesIntegration, StopStringsAndStopIdsEndTheStream) {
  ServiceCluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.start_all());
  auto tok = Tokenizer::load(cluster.model_dir());
  ASSERT_TRUE(tok.is_ok());
  auto c = cluster.client();
  proto::GenerateRequest probe;
  probe.prompt_ids = {1, 2, 3, 4, 5};
  probe.max_tokens = 12;
  probe.ignore_eos = true;
  auto full = c->generate(probe, nullptr, 30000);
  ASSERT_TRUE(full.is_ok()) << full.status().to_string();
  ASSERT_EQ(full->token_ids.size(), 12u);

  // Stop on the 4th generated id: the stream ends with it.
  proto::GenerateRequest by_id = probe;
  by_id.stop_token_ids = {full->token_ids[3]};
  auto stopped = c->generate(by_id, nullptr, 30000);
  ASSERT_TRUE(stopped.is_ok());
  EXPECT_EQ(stopped->finish_reason, "stop");
  const auto first = std::find(full->token_ids.begin(), full->token_ids.end(), full->token_ids[3]);
  EXPECT_EQ(stopped->token_ids, std::vector<int32_t>(full->token_ids.begin(), first + 1));

  // Stop string taken from the middle of the text: the text ends right before it.
  const std::string text = full->text;
  ASSERT_GT(text.size(), 6u);
  const std::string stop = text.substr(text.size() / 2, 3);
  proto::GenerateRequest by_string = probe;
  by_string.stop = {stop};
  auto cut = c->generate(by_string, nullptr, 30000);
  ASSERT_TRUE(cut.is_ok());
  EXPECT_EQ(cut->finish_reason, "stop");
  EXPECT_EQ(cut->text, text.substr(0, text.find(stop)));
  EXPECT_TRUE(cluster.wait_metric("litellama_scheduler_kv_slots_used", 0));
}

TEST(ServicesIntegration, AbortMidStreamFreesEverySlot) {
  ServiceCluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.start_all());
  auto c = cluster.client();
  std::vector<uint64_t> ids;
  for (int i = 0; i < 6; ++i) {
    proto::GenerateRequest r;
    r.prompt_ids = {10, 20, 30, 40 + i};
    r.max_tokens = 300;  // all six fit the pool together
    r.ignore_eos = true;
    ids.push_back(c->submit(r).value());
  }
  // Wait until every request streamed something, then abort them all.
  std::set<uint64_t> started;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (started.size() < ids.size() && std::chrono::steady_clock::now() < deadline) {
    auto e = c->next_event(100);
    if (e.is_ok() && *e && (*e)->kind == net::ClientEvent::Kind::kChunk) {
      started.insert((*e)->request_id());
    }
  }
  ASSERT_EQ(started.size(), ids.size());
  EXPECT_TRUE(cluster.wait_metric_above("litellama_scheduler_kv_slots_used", 0));
  for (uint64_t id : ids) ASSERT_TRUE(c->abort(id).is_ok());
  auto got = collect(*c, ids, 10000);
  for (uint64_t id : ids) {
    EXPECT_TRUE(got[id].done);
    EXPECT_EQ(got[id].finish_reason, "abort");
    EXPECT_LT(got[id].ids.size(), 300u);
  }
  EXPECT_TRUE(cluster.wait_metric("litellama_scheduler_kv_slots_used", 0));
  EXPECT_TRUE(cluster.wait_metric("litellama_scheduler_requests_running", 0));
  EXPECT_TRUE(cluster.wait_metric("litellama_scheduler_aborts_total", 6));

  // A client that goes away mid-stream is aborted as well.
  {
    auto gone = cluster.client();
    proto::GenerateRequest r;
    r.prompt_ids = {5, 6, 7};
    r.max_tokens = 1000;
    r.ignore_eos = true;
    const uint64_t id = gone->submit(r).value();
    auto got_gone = collect(*gone, {id}, 300);
    (void)got_gone;
  }
  EXPECT_TRUE(cluster.wait_metric("litellama_scheduler_aborts_total", 7));
  EXPECT_TRUE(cluster.wait_metric("litellama_scheduler_kv_slots_used", 0));
}

// Sends raw frames on a socket of the given type connected to `endpoint`.
void send_garbage(const std::string& endpoint, zmq::socket_type type) {
  zmq::context_t ctx;
  zmq::socket_t s(ctx, type);
  s.set(zmq::sockopt::linger, 2000);
  s.connect(endpoint);
  std::vector<std::string> payloads;
  payloads.push_back("");
  payloads.push_back("\xff\xfe\x00garbage");
  payloads.push_back(std::string(1, '\xdd') + std::string("\xff\xff\xff\xff", 4));  // huge array
  {
    msgpack::sbuffer b;
    msgpack::pack(b, std::vector<int>{1, 2, 3});  // not a map
    payloads.emplace_back(b.data(), b.size());
  }
  payloads.push_back(testing::pack_raw_message(99, "generate_request"));  // unknown version
  payloads.push_back(testing::pack_raw_message(proto::kProtocolVersion, "no_such_message"));
  payloads.push_back(testing::pack_raw_message(4, proto::kProtocolVersion, "generate_request",
                                               [](testing::RawPacker& p) {
                                                 p.pack(std::string("max_tokens"));
                                                 p.pack(std::string("many"));  // wrong type
                                                 p.pack(std::string("prompt_ids"));
                                                 p.pack(std::string("x"));
                                               }));
  // Valid messages of the wrong hop.
  payloads.push_back(proto::encode(proto::StepResult{}));
  payloads.push_back(proto::encode(proto::DetokenizeReply{}));
  payloads.push_back(proto::encode(proto::GenerateChunk{}));
  for (const auto& p : payloads) s.send(zmq::buffer(p), zmq::send_flags::none);
  // A multi-frame message.
  s.send(zmq::str_buffer("a"), zmq::send_flags::sndmore);
  s.send(zmq::str_buffer("b"), zmq::send_flags::none);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
}

TEST(ServicesIntegration, MalformedFramesOnEverySocketAreSurvived) {
  ServiceCluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.start_all());
  send_garbage(cluster.endpoint("client"), zmq::socket_type::dealer);
  send_garbage(cluster.endpoint("worker"), zmq::socket_type::dealer);
  send_garbage(cluster.endpoint("tokenizer"), zmq::socket_type::dealer);

  // Every process is still up and serving.
  for (const char* name : {"scheduler", "worker", "tokenizer"}) {
    EXPECT_TRUE(cluster.process(name).running()) << name;
  }
  auto c = cluster.client();
  proto::GenerateRequest r;
  r.prompt = "still serving";
  r.max_tokens = 5;
  r.ignore_eos = true;
  auto done = c->generate(r, nullptr, 30000);
  ASSERT_TRUE(done.is_ok()) << done.status().to_string();
  EXPECT_EQ(done->token_ids.size(), 5u);

  const std::string m = cluster.scheduler_metrics();
  EXPECT_GE(metric_value(m, "litellama_scheduler_protocol_errors_total{socket=\"client\"}"), 10);
  EXPECT_GE(metric_value(m, "litellama_scheduler_protocol_errors_total{socket=\"worker\"}"), 10);
  EXPECT_GE(metric_value(m, "litellama_scheduler_protocol_errors_total{socket=\"tokenizer\"}"), 10);
  // A bad request id answer never hangs: bad requests are refused with an error.
  proto::GenerateRequest bad;
  bad.prompt_ids = {1, 2};
  bad.max_tokens = 0;
  auto refused = c->generate(bad, nullptr, 5000);
  EXPECT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  proto::GenerateRequest out_of_vocab;
  out_of_vocab.prompt_ids = {1, 999999999};
  out_of_vocab.max_tokens = 3;
  auto refused2 = c->generate(out_of_vocab, nullptr, 5000);
  EXPECT_FALSE(refused2.is_ok());
  EXPECT_TRUE(cluster.process("worker").running());
}

TEST(ServicesIntegration, WorkerKilledMidStreamFailsRequestsAndServiceRecovers) {
  ServiceCluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.start_all());
  auto c = cluster.client();
  const std::vector<uint64_t> ids = testing::submit_ignoring_eos(*c, 4, 400);
  std::set<uint64_t> started;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (started.size() < ids.size() && std::chrono::steady_clock::now() < deadline) {
    auto e = c->next_event(100);
    ASSERT_TRUE(!e.is_ok() || !*e || (*e)->kind == net::ClientEvent::Kind::kChunk);
    if (e.is_ok() && *e) started.insert((*e)->request_id());
  }
  ASSERT_EQ(started.size(), ids.size());

  cluster.process("worker").signal(SIGKILL);
  const auto killed_at = std::chrono::steady_clock::now();
  auto got = collect(*c, ids, 5000);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  for (uint64_t id : ids) {
    EXPECT_TRUE(got[id].done) << "request " << id << " hangs";
    EXPECT_TRUE(got[id].error) << "request " << id;
  }
  EXPECT_LT(seconds, 3.0);
  // Not ready without a worker (polled briefly: the requests' errors and the readiness flag are
  // set by the same event, but the HTTP listener runs on its own thread).
  testing::poll_until(
      [&] { return testing::http_get(cluster.scheduler_port(), "/ready").first == 503; }, 2000);
  EXPECT_EQ(testing::http_get(cluster.scheduler_port(), "/ready").first, 503);
  EXPECT_EQ(testing::http_get(cluster.scheduler_port(), "/health").first, 200);

  cluster.start_worker();
  cluster.wait_ready();
  const proto::GenerateRequest r = testing::ignoring_eos_request({100, 200, 300}, 8);
  auto done = c->generate(r, nullptr, 30000);
  ASSERT_TRUE(done.is_ok()) << done.status().to_string();
  GenerationRequest ref;
  ref.prompt_ids = r.prompt_ids;
  ref.max_new_tokens = 8;
  EXPECT_EQ(done->token_ids, offline_reference(cluster.model_dir(), {ref})[0].output_ids);
  EXPECT_EQ(testing::http_get(cluster.scheduler_port(), "/ready").first, 200);
  EXPECT_TRUE(cluster.wait_metric("litellama_scheduler_kv_slots_used", 0));
}

TEST(ServicesIntegration, TokenizerRestartLosesNothing) {
  ServiceCluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.start_all());
  cluster.process("tokenizer").signal(SIGKILL);
  auto c = cluster.client();
  proto::GenerateRequest r;
  r.messages = {{"user", "hello"}};
  r.max_tokens = 6;
  r.ignore_eos = true;
  const uint64_t id = c->submit(r).value();
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  cluster.start_tokenizer();
  auto got = collect(*c, {id}, 30000);
  ASSERT_TRUE(got[id].done);
  EXPECT_FALSE(got[id].error);
  EXPECT_EQ(got[id].ids.size(), 6u);
}

TEST(ServicesIntegration, MetricsOverHttpAreConsistent) {
  ServiceCluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.start_all());
  auto c = cluster.client();
  auto info = c->server_info(5000);
  ASSERT_TRUE(info.is_ok()) << info.status().to_string();
  EXPECT_EQ(info->device, "cpu");
  EXPECT_EQ(info->dtype, "float32");  // --dtype auto on the CPU
  std::vector<uint64_t> ids;
  int total_generated = 0, total_prompt = 0;
  for (int i = 0; i < 5; ++i) {
    proto::GenerateRequest r;
    r.prompt_ids = std::vector<int32_t>(static_cast<size_t>(3 + i), 42);
    r.max_tokens = 4 + i;
    r.ignore_eos = true;
    total_generated += r.max_tokens;
    total_prompt += 3 + i;
    ids.push_back(c->submit(r).value());
  }
  auto got = collect(*c, ids);
  for (uint64_t id : ids) ASSERT_TRUE(got[id].done && !got[id].error);
  ASSERT_TRUE(
      cluster.wait_metric("litellama_scheduler_requests_finished_total{reason=\"length\"}", 5));
  const std::string m = cluster.scheduler_metrics();
  EXPECT_EQ(metric_value(m, "litellama_scheduler_generation_tokens_total"), total_generated);
  EXPECT_EQ(metric_value(m, "litellama_scheduler_prompt_tokens_total"), total_prompt);
  EXPECT_EQ(metric_value(m, "litellama_scheduler_time_to_first_token_seconds_count"), 5);
  EXPECT_EQ(metric_value(m, "litellama_scheduler_e2e_request_latency_seconds_count"), 5);
  EXPECT_EQ(metric_value(m, "litellama_scheduler_queue_time_seconds_count"), 5);
  EXPECT_EQ(metric_value(m, "litellama_scheduler_inter_token_latency_seconds_count"),
            total_generated - 5);
  EXPECT_EQ(metric_value(m, "litellama_scheduler_requests_running"), 0);
  EXPECT_EQ(metric_value(m, "litellama_scheduler_requests_waiting"), 0);
  EXPECT_EQ(metric_value(m, "litellama_scheduler_kv_slots_used"), 0);
  EXPECT_EQ(metric_value(m, "litellama_scheduler_kv_slots_capacity"), ServiceCluster::kKvSlots);
  EXPECT_EQ(metric_value(m, "litellama_scheduler_aborts_total"), 0);
  EXPECT_GT(metric_value(m, "litellama_scheduler_hop_duration_seconds_count{hop=\"worker_step\"}"),
            0);
  EXPECT_NE(m.find("litellama_scheduler_protocol_errors_total"), std::string::npos);

  const std::string w = testing::http_get(cluster.worker_port(), "/metrics").second;
  EXPECT_GT(metric_value(w, "litellama_worker_steps_total"), 0);
  EXPECT_GT(metric_value(w, "litellama_worker_step_duration_seconds_count"), 0);
  EXPECT_EQ(metric_value(w, "litellama_worker_kv_slots_capacity"), ServiceCluster::kKvSlots);
  // A float32 checkpoint: the CPU backend holds exactly its tensors' bytes.
  auto checkpoint = Checkpoint::open(cluster.model_dir());
  ASSERT_TRUE(checkpoint.is_ok());
  EXPECT_EQ(metric_value(w, "litellama_worker_weight_bytes{format=\"float32\"}"),
            static_cast<double>(checkpoint->size_bytes()));
  // Series only a GPU backend writes are not exported by a CPU worker (-1: absent).
  EXPECT_EQ(metric_value(w, "litellama_worker_step_device_seconds_count"), -1);
  EXPECT_EQ(metric_value(w, "litellama_worker_graph_steps_total{kind=\"replayed\"}"), -1);
  EXPECT_EQ(metric_value(w, "litellama_worker_graph_steps_total{kind=\"captured\"}"), -1);
  EXPECT_EQ(metric_value(w, "litellama_worker_cascade_steps_total"), -1);
  const std::string t = testing::http_get(cluster.tokenizer_port(), "/metrics").second;
  EXPECT_GE(metric_value(t, "litellama_tokenizer_detokenize_items_total"), 5);
  for (int port : {cluster.scheduler_port(), cluster.worker_port(), cluster.tokenizer_port()}) {
    EXPECT_EQ(testing::http_get(port, "/health").first, 200);
    EXPECT_EQ(testing::http_get(port, "/ready").first, 200);
  }
}

}  // namespace
}  // namespace litellama

namespace litellama {
namespace {

// `litellama chat --start-services`, the README's first command: the launcher starts the three
// services with the flags it passes them (--dtype among them), one answer streams back, and the
// services stop with it. A dtype the CPU worker cannot run ends with the worker's reason.
struct CliRun {
  int exit_code = -1;
  std::string output;
};

CliRun run_cli(const std::string& command) {
  CliRun r;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) r.output.append(buf, n);
  const int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(LauncherIntegration, ChatStartsTheServicesAnswersAndStops) {
  ServiceCluster cluster;  // only for its model and scratch directory
  ASSERT_NO_FATAL_FAILURE(cluster.make_model());
  const std::string base = cluster.bin_dir() + "/litellama chat --start-services --model " +
                           cluster.model_dir() + " --metrics-port 0 --threads 1 --kv-slots 2048";
  const std::string run_dir = (cluster.dir() / "launcher-run").string();
  const CliRun ok = run_cli(base + " --run-dir " + run_dir + " -m Hello --max-new-tokens 6");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("starting the services"), std::string::npos) << ok.output;

  const CliRun bad =
      run_cli(base + " --run-dir " + run_dir + "-f16 --dtype float16 -m Hello --max-new-tokens 2");
  EXPECT_NE(bad.exit_code, 0) << bad.output;
  EXPECT_NE(bad.output.find("float16"), std::string::npos) << bad.output;
}

// `litellama bench --sweep`: one run per (concurrency, requests) pair against one server, one
// table row each, every request completed; sampled requests (--temperature, --top-k, --top-p)
// complete too; a malformed sweep is refused before connecting.
TEST(LauncherIntegration, BenchSweepPrintsOneRowPerRun) {
  ServiceCluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.start_all());
  const std::string bench = cluster.bin_dir() + "/litellama bench --server " +
                            cluster.endpoint("client") + " --input-len 8 --output-len 4";
  const CliRun ok = run_cli(bench + " --sweep 1:2,3:6");
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("| concurrency | requests | completed |"), std::string::npos)
      << ok.output;
  EXPECT_NE(ok.output.find("| 1 | 2 | 2 |"), std::string::npos) << ok.output;
  EXPECT_NE(ok.output.find("| 3 | 6 | 6 |"), std::string::npos) << ok.output;
  EXPECT_TRUE(
      cluster.wait_metric("litellama_scheduler_requests_finished_total{reason=\"length\"}", 8));

  const CliRun json =
      run_cli(bench + " --sweep 2:2 --json --temperature 0.8 --top-k 40 --top-p 0.9");
  ASSERT_EQ(json.exit_code, 0) << json.output;
  const auto arr = nlohmann::json::parse(json.output.substr(json.output.find('[')));
  ASSERT_EQ(arr.size(), 1u);
  EXPECT_EQ(arr[0]["n_completed"], 2);
  EXPECT_EQ(arr[0]["output_tokens"], 8);
  EXPECT_FLOAT_EQ(arr[0]["temperature"].get<float>(), 0.8f);
  EXPECT_EQ(arr[0]["top_k"], 40);
  EXPECT_FLOAT_EQ(arr[0]["top_p"].get<float>(), 0.9f);

  const CliRun bad_p = run_cli(bench + " -n 1 --top-p 1.5");
  EXPECT_NE(bad_p.exit_code, 0);
  EXPECT_NE(bad_p.output.find("--top-p"), std::string::npos) << bad_p.output;

  const CliRun bad = run_cli(bench + " --sweep 1:0");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--sweep item '1:0' is not CONCURRENCY:REQUESTS"), std::string::npos)
      << bad.output;
}

}  // namespace
}  // namespace litellama
