#include "services/scheduler/radix_cache.h"

#include <algorithm>
#include <queue>
#include <tuple>

namespace litellama {

RadixCache::RadixCache(KvSlotAllocator& allocator)
    : allocator_(allocator), root_(std::make_unique<Node>()) {}

RadixCache::~RadixCache() = default;

RadixCache::Node* RadixCache::split(Node* n, size_t at) {
  auto upper = std::make_unique<Node>();
  Node* up = upper.get();
  up->key.assign(n->key.begin(), n->key.begin() + static_cast<std::ptrdiff_t>(at));
  up->slots.assign(n->slots.begin(), n->slots.begin() + static_cast<std::ptrdiff_t>(at));
  up->parent = n->parent;
  up->last_use = n->last_use;
  n->key.erase(n->key.begin(), n->key.begin() + static_cast<std::ptrdiff_t>(at));
  n->slots.erase(n->slots.begin(), n->slots.begin() + static_cast<std::ptrdiff_t>(at));
  Node* parent = n->parent;
  auto& slot_in_parent = parent->children[up->key.front()];
  std::unique_ptr<Node> lower = std::move(slot_in_parent);
  lower->parent = up;
  up->children[lower->key.front()] = std::move(lower);
  slot_in_parent = std::move(upper);
  return up;
}

int32_t RadixCache::peek(std::span<const int32_t> tokens, int32_t max_len) const {
  const size_t limit = std::min(tokens.size(), static_cast<size_t>(std::max(max_len, 0)));
  const Node* n = root_.get();
  size_t pos = 0;
  while (pos < limit) {
    auto it = n->children.find(tokens[pos]);
    if (it == n->children.end()) break;
    const Node* c = it->second.get();
    size_t k = 0;
    while (k < c->key.size() && pos + k < limit && c->key[k] == tokens[pos + k]) ++k;
    pos += k;
    if (k < c->key.size()) break;
    n = c;
  }
  return static_cast<int32_t>(pos);
}

int32_t RadixCache::match(std::span<const int32_t> tokens, int32_t max_len,
                          std::vector<int32_t>* slots) {
  const size_t limit = std::min(tokens.size(), static_cast<size_t>(std::max(max_len, 0)));
  const uint64_t now = ++clock_;
  Node* n = root_.get();
  size_t pos = 0;
  const size_t first = slots->size();
  while (pos < limit) {
    auto it = n->children.find(tokens[pos]);
    if (it == n->children.end()) break;
    Node* c = it->second.get();
    size_t k = 0;
    while (k < c->key.size() && pos + k < limit && c->key[k] == tokens[pos + k]) ++k;
    // The caller holds whole nodes: a partial match splits the edge there.
    if (k < c->key.size()) c = split(c, k);
    c->last_use = now;
    slots->insert(slots->end(), c->slots.begin(), c->slots.end());
    pos += k;
    n = c;
    if (k == 0) break;
  }
  allocator_.retain(std::span<const int32_t>(slots->data() + first, slots->size() - first));
  return static_cast<int32_t>(pos);
}

int32_t RadixCache::insert(std::span<const int32_t> tokens, std::span<const int32_t> slots) {
  const size_t len = std::min(tokens.size(), slots.size());
  const uint64_t now = ++clock_;
  Node* n = root_.get();
  size_t pos = 0;
  while (pos < len) {
    auto it = n->children.find(tokens[pos]);
    if (it == n->children.end()) {
      auto leaf = std::make_unique<Node>();
      leaf->key.assign(tokens.begin() + static_cast<std::ptrdiff_t>(pos),
                       tokens.begin() + static_cast<std::ptrdiff_t>(len));
      leaf->slots.assign(slots.begin() + static_cast<std::ptrdiff_t>(pos),
                         slots.begin() + static_cast<std::ptrdiff_t>(len));
      leaf->parent = n;
      leaf->last_use = now;
      allocator_.retain(leaf->slots);
      allocator_.set_cached(leaf->slots, true);
      const auto added = static_cast<int32_t>(leaf->slots.size());
      n_slots_ += added;
      n->children[leaf->key.front()] = std::move(leaf);
      return added;
    }
    Node* c = it->second.get();
    size_t k = 0;
    while (k < c->key.size() && pos + k < len && c->key[k] == tokens[pos + k]) ++k;
    if (k < c->key.size()) c = split(c, k);
    c->last_use = now;
    pos += k;
    n = c;
  }
  return 0;
}

bool RadixCache::evictable(const Node* n) const {
  // Refcounts never increase along a path, so the first slot tells for the whole node.
  return n != root_.get() && n->children.empty() && !n->slots.empty() &&
         allocator_.refcount(n->slots.front()) == 1;
}

int32_t RadixCache::evict(int32_t n) {
  if (n <= 0) return 0;
  using Entry = std::tuple<uint64_t, Node*>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
  std::vector<Node*> stack{root_.get()};
  while (!stack.empty()) {
    Node* x = stack.back();
    stack.pop_back();
    for (auto& [id, c] : x->children) stack.push_back(c.get());
    if (evictable(x)) heap.emplace(x->last_use, x);
  }
  int32_t freed = 0;
  while (freed < n && !heap.empty()) {
    Node* x = std::get<1>(heap.top());
    heap.pop();
    allocator_.set_cached(x->slots, false);
    allocator_.release(x->slots);
    const auto count = static_cast<int32_t>(x->slots.size());
    freed += count;
    n_slots_ -= count;
    n_evicted_slots_ += count;
    Node* parent = x->parent;
    parent->children.erase(x->key.front());  // destroys x
    if (evictable(parent)) heap.emplace(parent->last_use, parent);
  }
  return freed;
}

void RadixCache::clear(bool release) {
  visit(root_.get(), [&](const Node* x) {
    allocator_.set_cached(x->slots, false);
    if (release) allocator_.release(x->slots);
  });
  root_ = std::make_unique<Node>();
  n_slots_ = 0;
}

template <typename F>
void RadixCache::visit(const Node* n, F&& f) const {
  std::vector<const Node*> stack{n};
  while (!stack.empty()) {
    const Node* x = stack.back();
    stack.pop_back();
    f(x);
    for (const auto& [id, c] : x->children) stack.push_back(c.get());
  }
}

std::vector<int32_t> RadixCache::cached_slots() const {
  std::vector<int32_t> out;
  visit(root_.get(),
        [&](const Node* x) { out.insert(out.end(), x->slots.begin(), x->slots.end()); });
  return out;
}

int32_t RadixCache::n_nodes() const {
  int32_t count = -1;  // the root holds nothing
  visit(root_.get(), [&](const Node*) { ++count; });
  return count;
}

}  // namespace litellama
