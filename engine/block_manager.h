// The page pool of the paged KV cache: allocation and freeing of pages, reference counts so that
// requests with a common prefix share its full pages, and the prefix cache that finds those pages
// by content. Layer: engine (host-only). One page id addresses the same slot in every layer.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <unordered_map>
#include <vector>

#include "sequence.h"

namespace gqattn::engine {

class BlockManager {
 public:
  // Throws gqattn::Error when num_pages < 1 or page_size < 1.
  BlockManager(int num_pages, int page_size);

  int num_pages() const { return int(ref_count_.size()); }
  int page_size() const { return page_size_; }
  int num_free_pages() const { return int(free_.size()); }
  int ref_count(int32_t page) const { return ref_count_.at(size_t(page)); }
  // Pages needed to hold `tokens` tokens.
  int pages_for(int64_t tokens) const { return int((tokens + page_size_ - 1) / page_size_); }

  // ---- pages ----
  bool can_allocate(int n) const { return n <= num_free_pages(); }
  // n fresh pages with reference count 1 (oldest freed first). Throws when fewer are free.
  std::vector<int32_t> allocate(int n);
  // One more reference to each page (a request sharing them). Pages must be in use.
  void retain(const std::vector<int32_t>& pages);
  // One reference fewer to each page; a page reaching 0 returns to the free list.
  void release(const std::vector<int32_t>& pages);

  // ---- sequences ----
  // Pages `seq` lacks to hold `tokens` tokens (0 when it holds them already).
  int missing_pages(const Sequence& seq, int64_t tokens) const {
    return std::max(0, pages_for(tokens) - int(seq.pages.size()));
  }
  // True when `seq` can hold `tokens` tokens after allocating the missing pages.
  bool can_grow(const Sequence& seq, int64_t tokens) const;
  // Appends pages to seq.pages until it holds `tokens` tokens. Throws when the pool is short.
  void grow(Sequence& seq, int64_t tokens);
  // Releases every page of `seq` and forgets its prefix-cache hashes.
  void free(Sequence& seq);

  // ---- prefix cache (full pages, found by their tokens and every token before them) ----
  // Shares the longest run of cached full pages that equal seq.tokens' leading pages, leaving at
  // least one token to compute: seq.pages / page_hashes / num_computed are set, the pages retained.
  // Returns the number of tokens matched. seq must own no pages.
  int64_t match_prefix(Sequence& seq);
  // Registers seq's full pages of computed tokens that are not yet registered.
  void register_full_pages(Sequence& seq);

 private:
  struct CachedPage {
    int32_t page;
    uint64_t prev_hash;           // the hash of the pages before it
    std::vector<int32_t> tokens;  // a hit checks both: a false match needs two 64-bit collisions
  };
  uint64_t page_hash(uint64_t prev, const int32_t* tokens) const;
  void forget_cached(int32_t page);

  int page_size_;
  std::vector<int> ref_count_;
  std::deque<int32_t> free_;
  std::unordered_map<uint64_t, CachedPage> cache_;      // hash -> page
  std::unordered_map<int32_t, uint64_t> page_to_hash_;  // page -> its hash in cache_
};

}  // namespace gqattn::engine
