// Page allocation with reference counts and the content-addressed prefix cache.
// Layer: engine (host-only).
#include "block_manager.h"

#include <algorithm>

#include "gqattn/error.h"
#include "random.h"

namespace gqattn::engine {

BlockManager::BlockManager(int num_pages, int page_size) : page_size_(page_size) {
  GQ_CHECK(num_pages >= 1, "block manager: num_pages (", num_pages, ") must be >= 1");
  GQ_CHECK(page_size >= 1, "block manager: page_size (", page_size, ") must be >= 1");
  ref_count_.assign(size_t(num_pages), 0);
  for (int32_t p = 0; p < num_pages; ++p) free_.push_back(p);
}

std::vector<int32_t> BlockManager::allocate(int n) {
  GQ_CHECK(n >= 0 && can_allocate(n), "block manager: ", n, " pages asked for, ", num_free_pages(),
           " free of ", num_pages());
  std::vector<int32_t> pages;
  pages.reserve(size_t(n));
  for (int i = 0; i < n; ++i) {
    const int32_t p = free_.front();
    free_.pop_front();
    forget_cached(p);  // its old content is about to be overwritten
    ref_count_[size_t(p)] = 1;
    pages.push_back(p);
  }
  return pages;
}

void BlockManager::retain(const std::vector<int32_t>& pages) {
  for (int32_t p : pages) {
    GQ_CHECK(p >= 0 && p < num_pages(), "block manager: page ", p, " outside the pool");
    int& rc = ref_count_[size_t(p)];
    if (rc == 0) {
      // A cached page that had been freed: take it back out of the free list.
      const auto it = std::find(free_.begin(), free_.end(), p);
      GQ_CHECK(it != free_.end(), "block manager: page ", p, " has no references and is not free");
      free_.erase(it);
    }
    ++rc;
  }
}

void BlockManager::release(const std::vector<int32_t>& pages) {
  for (int32_t p : pages) {
    GQ_CHECK(p >= 0 && p < num_pages() && ref_count_[size_t(p)] > 0, "block manager: page ", p,
             " released but not in use");
    if (--ref_count_[size_t(p)] == 0) free_.push_back(p);
  }
}

bool BlockManager::can_grow(const Sequence& seq, int64_t tokens) const {
  return can_allocate(missing_pages(seq, tokens));
}

void BlockManager::grow(Sequence& seq, int64_t tokens) {
  const int missing = missing_pages(seq, tokens);
  if (missing == 0) return;
  const std::vector<int32_t> fresh = allocate(missing);
  seq.pages.insert(seq.pages.end(), fresh.begin(), fresh.end());
}

void BlockManager::free(Sequence& seq) {
  release(seq.pages);
  seq.pages.clear();
  seq.page_hashes.clear();
}

uint64_t BlockManager::page_hash(uint64_t prev, const int32_t* tokens) const {
  uint64_t h = mix64(prev);
  for (int i = 0; i < page_size_; ++i) h = mix64(h ^ uint64_t(uint32_t(tokens[i])));
  return h;
}

void BlockManager::forget_cached(int32_t page) {
  const auto it = page_to_hash_.find(page);
  if (it == page_to_hash_.end()) return;
  cache_.erase(it->second);
  page_to_hash_.erase(it);
}

int64_t BlockManager::match_prefix(Sequence& seq) {
  GQ_CHECK(seq.pages.empty(), "block manager: match_prefix on a request that owns pages");
  // The last token is always computed, so its logits exist.
  const int64_t max_pages = (seq.num_tokens() - 1) / page_size_;
  uint64_t prev = 0;
  std::vector<int32_t> pages;
  std::vector<uint64_t> hashes;
  for (int64_t i = 0; i < max_pages; ++i) {
    const int32_t* tokens = seq.tokens.data() + i * page_size_;
    const uint64_t h = page_hash(prev, tokens);
    const auto it = cache_.find(h);
    if (it == cache_.end() || it->second.prev_hash != prev ||
        !std::equal(it->second.tokens.begin(), it->second.tokens.end(), tokens))
      break;
    pages.push_back(it->second.page);
    hashes.push_back(h);
    prev = h;
  }
  retain(pages);
  seq.pages = pages;
  seq.page_hashes = hashes;
  seq.num_computed = int64_t(pages.size()) * page_size_;
  return seq.num_computed;
}

void BlockManager::register_full_pages(Sequence& seq) {
  const int64_t full = std::min<int64_t>(seq.num_computed / page_size_, int64_t(seq.pages.size()));
  for (int64_t i = int64_t(seq.page_hashes.size()); i < full; ++i) {
    const uint64_t prev = i == 0 ? 0 : seq.page_hashes[size_t(i - 1)];
    const int32_t* tokens = seq.tokens.data() + i * page_size_;
    const uint64_t h = page_hash(prev, tokens);
    seq.page_hashes.push_back(h);
    const int32_t page = seq.pages[size_t(i)];
    if (cache_.count(h) || page_to_hash_.count(page)) continue;  // an equal page is cached already
    cache_[h] = CachedPage{page, prev, std::vector<int32_t>(tokens, tokens + page_size_)};
    page_to_hash_[page] = h;
  }
}

}  // namespace gqattn::engine
