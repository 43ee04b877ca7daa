// The block manager: allocation, freeing, exhaustion, reference counts of shared pages and the
// prefix cache. Layer: tests (label cpu).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "block_manager.h"
#include "gqattn/error.h"

namespace gqattn::engine {
namespace {

Sequence make_seq(int64_t id, std::vector<int32_t> tokens) {
  Sequence s;
  s.id = id;
  s.tokens = std::move(tokens);
  s.num_prompt_tokens = int(s.tokens.size());
  return s;
}

TEST(BlockManager, AllocatesDistinctPagesAndFreesThem) {
  BlockManager bm(8, 4);
  EXPECT_EQ(bm.num_free_pages(), 8);
  const std::vector<int32_t> a = bm.allocate(3), b = bm.allocate(5);
  std::set<int32_t> all(a.begin(), a.end());
  all.insert(b.begin(), b.end());
  EXPECT_EQ(all.size(), 8u);
  EXPECT_EQ(bm.num_free_pages(), 0);
  for (int32_t p : a) EXPECT_EQ(bm.ref_count(p), 1);
  bm.release(a);
  EXPECT_EQ(bm.num_free_pages(), 3);
  for (int32_t p : a) EXPECT_EQ(bm.ref_count(p), 0);
  bm.release(b);
  EXPECT_EQ(bm.num_free_pages(), 8);
}

TEST(BlockManager, ExhaustionThrowsAndChangesNothing) {
  BlockManager bm(4, 16);
  bm.allocate(3);
  EXPECT_FALSE(bm.can_allocate(2));
  EXPECT_TRUE(bm.can_allocate(1));
  EXPECT_THROW(bm.allocate(2), Error);
  EXPECT_EQ(bm.num_free_pages(), 1);
  EXPECT_THROW(BlockManager(0, 16), Error);
  EXPECT_THROW(BlockManager(4, 0), Error);
}

TEST(BlockManager, ReleasingAFreePageThrows) {
  BlockManager bm(2, 1);
  const std::vector<int32_t> a = bm.allocate(1);
  bm.release(a);
  EXPECT_THROW(bm.release(a), Error);
  EXPECT_THROW(bm.release({7}), Error);
}

TEST(BlockManager, SharedPagesAreFreedByTheLastReference) {
  BlockManager bm(4, 2);
  const std::vector<int32_t> prefix = bm.allocate(2);
  bm.retain(prefix);  // a second request shares the prefix
  for (int32_t p : prefix) EXPECT_EQ(bm.ref_count(p), 2);
  bm.release(prefix);
  EXPECT_EQ(bm.num_free_pages(), 2);
  for (int32_t p : prefix) EXPECT_EQ(bm.ref_count(p), 1);
  bm.release(prefix);
  EXPECT_EQ(bm.num_free_pages(), 4);
}

TEST(BlockManager, GrowsSequencesPageByPage) {
  BlockManager bm(4, 4);
  Sequence s = make_seq(0, {1, 2, 3});
  EXPECT_TRUE(bm.can_grow(s, 16));
  EXPECT_FALSE(bm.can_grow(s, 17));
  bm.grow(s, 3);
  EXPECT_EQ(s.pages.size(), 1u);
  bm.grow(s, 4);
  EXPECT_EQ(s.pages.size(), 1u);
  bm.grow(s, 5);
  EXPECT_EQ(s.pages.size(), 2u);
  EXPECT_THROW(bm.grow(s, 17), Error);
  bm.free(s);
  EXPECT_TRUE(s.pages.empty());
  EXPECT_EQ(bm.num_free_pages(), 4);
}

TEST(BlockManager, PrefixCacheSharesFullPagesOfEqualPrefixes) {
  BlockManager bm(16, 4);
  // 10 tokens: two full pages and a partial one.
  Sequence a = make_seq(0, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  bm.grow(a, 10);
  a.num_computed = 10;
  bm.register_full_pages(a);
  EXPECT_EQ(a.page_hashes.size(), 2u);

  // Same first page, different second page: only the first is shared.
  Sequence b = make_seq(1, {1, 2, 3, 4, 5, 6, 0, 8, 9});
  EXPECT_EQ(bm.match_prefix(b), 4);
  ASSERT_EQ(b.pages.size(), 1u);
  EXPECT_EQ(b.pages[0], a.pages[0]);
  EXPECT_EQ(bm.ref_count(a.pages[0]), 2);

  // Identical prompt: both full pages, never the last token (it must be computed for logits).
  Sequence c = make_seq(2, {1, 2, 3, 4, 5, 6, 7, 8});
  EXPECT_EQ(bm.match_prefix(c), 4);
  Sequence d = make_seq(3, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  EXPECT_EQ(bm.match_prefix(d), 8);
  EXPECT_EQ(bm.ref_count(a.pages[1]), 2);

  // A different first page breaks the chain even if the second page's tokens match.
  Sequence e = make_seq(4, {0, 2, 3, 4, 5, 6, 7, 8, 9});
  EXPECT_EQ(bm.match_prefix(e), 0);

  // Cached pages survive their owner's release and are found again until reallocated.
  const std::vector<int32_t> a_pages = a.pages;
  bm.free(a);
  bm.free(b);
  bm.free(c);
  bm.free(d);
  EXPECT_EQ(bm.num_free_pages(), 16);
  Sequence f = make_seq(5, {1, 2, 3, 4, 5, 6, 7, 8, 11});
  EXPECT_EQ(bm.match_prefix(f), 8);
  EXPECT_EQ(f.pages, std::vector<int32_t>(a_pages.begin(), a_pages.begin() + 2));
  EXPECT_EQ(bm.num_free_pages(), 14);
  bm.free(f);
  bm.allocate(16);  // overwrites every page: the cache forgets them
  bm.release(std::vector<int32_t>{a_pages[0], a_pages[1]});
  Sequence g = make_seq(6, {1, 2, 3, 4, 5, 6, 7, 8, 11});
  EXPECT_EQ(bm.match_prefix(g), 0);
}

}  // namespace
}  // namespace gqattn::engine
