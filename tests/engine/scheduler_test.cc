// The scheduler without a model: a fake "model" samples token f(request, output index), so any
// lost, repeated or misplaced token shows. Page exhaustion, preemption and resumption, FIFO
// admission, chunked prefill mixed with decodes, and no page leaked. Layer: tests (label cpu).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <set>

#include "block_manager.h"
#include "gqattn/error.h"
#include "scheduler.h"

namespace gqattn::engine {
namespace {

int32_t fake_token(int64_t id, int output_index) { return int32_t(1000 * id + output_index); }

struct DriveResult {
  int64_t preemptions = 0;
  bool mixed_step = false;       // a step with decodes and a partial prefill chunk
  std::vector<int64_t> admitted;  // admission order, re-admissions included
  int steps = 0;
  int formed_ahead = 0;           // steps whose successor schedule_ahead formed
};

// Runs the scheduler to completion, checking invariants after every step.
DriveResult drive(Scheduler& sched, BlockManager& bm, std::vector<std::unique_ptr<Sequence>>& seqs) {
  DriveResult run;
  ScheduledBatch ahead;  // schedule_ahead's batch for this step, formed during the last one
  while (sched.has_unfinished()) {
    std::map<int64_t, SequenceStatus> before;
    for (const auto& s : seqs) before[s->id] = s->status;
    const int free_before = bm.num_free_pages();
    const ScheduledBatch batch = sched.schedule();
    if (!ahead.empty()) {
      // schedule() forms what schedule_ahead did, needing no page it did not already take.
      EXPECT_EQ(batch.decodes, ahead.decodes) << "step " << run.steps;
      EXPECT_TRUE(batch.prefills.empty() && batch.preempted.empty()) << "step " << run.steps;
      EXPECT_EQ(bm.num_free_pages(), free_before) << "step " << run.steps;
    }
    EXPECT_FALSE(batch.empty()) << "no progress at step " << run.steps;
    if (batch.empty()) break;
    run.preemptions += int64_t(batch.preempted.size());
    bool partial = false;
    for (const PrefillChunk& c : batch.prefills) {
      if (before[c.seq->id] == SequenceStatus::kWaiting) {
        run.admitted.push_back(c.seq->id);
        // FIFO: nobody still waiting arrived before an admitted request.
        for (const Sequence* w : sched.waiting()) EXPECT_GT(w->id, c.seq->id);
      }
      partial = partial || c.start + c.len < c.seq->num_tokens();
      EXPECT_EQ(c.start, c.seq->num_computed);
      EXPECT_GE(int64_t(c.seq->pages.size()), bm.pages_for(c.start + c.len));
    }
    run.mixed_step = run.mixed_step || (!batch.decodes.empty() && partial);
    for (const Sequence* d : batch.decodes) {
      EXPECT_EQ(d->num_pending(), 1);
      EXPECT_GE(int64_t(d->pages.size()), bm.pages_for(d->num_tokens()));
    }
    // Running requests own disjoint pages (no prefix caching here).
    std::set<int32_t> owned;
    size_t total = 0;
    for (const Sequence* s : sched.running()) {
      owned.insert(s->pages.begin(), s->pages.end());
      total += s->pages.size();
    }
    EXPECT_EQ(owned.size(), total);
    EXPECT_EQ(int(owned.size()) + bm.num_free_pages(), bm.num_pages());
    EXPECT_LE(batch.num_tokens(), 16);

    std::vector<int32_t> sampled;
    for (const Sequence* s : batch.sampling_sequences()) sampled.push_back(fake_token(s->id, s->num_output()));
    ahead = sched.schedule_ahead(batch);  // as the engine does: before the step's tokens are recorded
    run.formed_ahead += !ahead.empty();
    sched.postprocess(batch, sampled);
    ++run.steps;
  }
  return run;
}

std::vector<std::unique_ptr<Sequence>> make_requests(const std::vector<std::pair<int, int>>& prompt_and_output) {
  std::vector<std::unique_ptr<Sequence>> seqs;
  for (size_t i = 0; i < prompt_and_output.size(); ++i) {
    auto s = std::make_unique<Sequence>();
    s->id = int64_t(i);
    for (int t = 0; t < prompt_and_output[i].first; ++t) s->tokens.push_back(int32_t(t + 1));
    s->num_prompt_tokens = prompt_and_output[i].first;
    s->params.max_new_tokens = prompt_and_output[i].second;
    seqs.push_back(std::move(s));
  }
  return seqs;
}

void expect_complete(const std::vector<std::unique_ptr<Sequence>>& seqs) {
  for (const auto& s : seqs) {
    EXPECT_TRUE(s->finished()) << "request " << s->id;
    ASSERT_EQ(s->num_output(), s->params.max_new_tokens) << "request " << s->id;
    for (int i = 0; i < s->num_output(); ++i)
      EXPECT_EQ(s->tokens[size_t(s->num_prompt_tokens + i)], fake_token(s->id, i)) << "request " << s->id;
    for (int t = 0; t < s->num_prompt_tokens; ++t) EXPECT_EQ(s->tokens[size_t(t)], t + 1);
    EXPECT_TRUE(s->pages.empty());
  }
}

TEST(Scheduler, ChunkedPrefillMixesWithDecodes) {
  BlockManager bm(64, 4);
  SchedulerConfig cfg;
  cfg.max_num_seqs = 8;
  cfg.max_num_batched_tokens = 16;
  Scheduler sched(cfg, bm);
  auto seqs = make_requests({{5, 12}, {40, 6}, {3, 9}, {23, 4}});
  for (auto& s : seqs) sched.add(s.get());
  const DriveResult run = drive(sched, bm, seqs);
  expect_complete(seqs);
  EXPECT_TRUE(run.mixed_step);
  EXPECT_EQ(run.preemptions, 0);
  EXPECT_GT(run.formed_ahead, 0);
  EXPECT_EQ(bm.num_free_pages(), 64);
}

// schedule_ahead forms nothing that depends on the tokens of the step before: a request that may
// stop at EOS, a sampling request, one that finishes at this token, a waiting request, a prefill
// in the step, or too few pages for the next token.
TEST(Scheduler, ScheduleAheadOnlyWhereTheNextBatchIsKnown) {
  const auto decode_step = [](BlockManager& bm, Scheduler& sched, std::vector<std::unique_ptr<Sequence>>& seqs) {
    for (auto& s : seqs) sched.add(s.get());
    ScheduledBatch b = sched.schedule();  // the prefills
    std::vector<int32_t> sampled;
    for (const Sequence* s : b.sampling_sequences()) sampled.push_back(fake_token(s->id, s->num_output()));
    EXPECT_TRUE(sched.schedule_ahead(b).empty());  // a prefill step
    sched.postprocess(b, sampled);
    (void)bm;
    return sched.schedule();
  };
  const auto formed = [&](const std::function<void(Sequence&)>& tweak, int pages = 64) {
    BlockManager bm(pages, 4);
    Scheduler sched(SchedulerConfig{8, 64, false}, bm);
    auto seqs = make_requests({{4, 5}, {3, 5}});
    tweak(*seqs[1]);
    const ScheduledBatch b = decode_step(bm, sched, seqs);
    EXPECT_EQ(b.decodes.size(), 2u);
    const int free_before = bm.num_free_pages();
    const bool ok = !sched.schedule_ahead(b).empty();
    if (!ok) {
      EXPECT_EQ(bm.num_free_pages(), free_before);  // nothing taken
    }
    return ok;
  };
  EXPECT_TRUE(formed([](Sequence&) {}));
  EXPECT_FALSE(formed([](Sequence& s) { s.params.eos_token_id = 3; }));
  EXPECT_TRUE(formed([](Sequence& s) {
    s.params.eos_token_id = 3;
    s.params.ignore_eos = true;
  }));
  EXPECT_FALSE(formed([](Sequence& s) { s.params.temperature = 0.7f; }));
  EXPECT_FALSE(formed([](Sequence& s) { s.params.max_new_tokens = 2; }));  // its 2nd token ends it
  // Prompts of 4 and 3 tokens: the decode step holds 2 + 1 pages, and the token after it needs a
  // second page for request 1 (3 + 2 tokens): formed with a 4th page in the pool, not with 3.
  EXPECT_TRUE(formed([](Sequence&) {}, 4));
  EXPECT_FALSE(formed([](Sequence&) {}, 3));
  // A waiting request (admitted by schedule() after the step) makes it wait too.
  BlockManager bm(64, 4);
  Scheduler sched(SchedulerConfig{8, 64, false}, bm);
  auto seqs = make_requests({{4, 5}, {3, 5}});
  const ScheduledBatch b = decode_step(bm, sched, seqs);
  auto late = make_requests({{2, 2}});
  late[0]->id = 2;
  sched.add(late[0].get());
  EXPECT_TRUE(sched.schedule_ahead(b).empty());
}

TEST(Scheduler, PreemptsTheNewestWhenPagesRunOutAndResumesEveryRequest) {
  // 12 pages of 4 tokens: each request needs up to 5 pages, so 6 of them cannot all run.
  BlockManager bm(12, 4);
  SchedulerConfig cfg;
  cfg.max_num_seqs = 6;
  cfg.max_num_batched_tokens = 16;
  Scheduler sched(cfg, bm);
  auto seqs = make_requests({{6, 14}, {3, 16}, {7, 12}, {2, 18}, {5, 10}, {4, 15}});
  for (auto& s : seqs) sched.add(s.get());
  const DriveResult run = drive(sched, bm, seqs);
  expect_complete(seqs);
  EXPECT_GT(run.preemptions, 0);
  int preempted = 0;
  for (const auto& s : seqs) preempted += s->num_preemptions > 0;
  EXPECT_GT(preempted, 0);
  // The oldest request is never the victim: someone newer always is.
  EXPECT_EQ(seqs[0]->num_preemptions, 0);
  EXPECT_EQ(bm.num_free_pages(), 12);
}

TEST(Scheduler, AdmitsInArrivalOrder) {
  BlockManager bm(6, 4);
  SchedulerConfig cfg;
  cfg.max_num_seqs = 4;
  cfg.max_num_batched_tokens = 8;
  Scheduler sched(cfg, bm);
  // Request 1 is long: requests 2.. must not overtake it while it waits for pages.
  auto seqs = make_requests({{8, 8}, {12, 4}, {1, 2}, {1, 2}, {2, 3}});
  for (auto& s : seqs) sched.add(s.get());
  const DriveResult run = drive(sched, bm, seqs);
  expect_complete(seqs);
  std::vector<int64_t> first;
  for (int64_t id : run.admitted)
    if (std::find(first.begin(), first.end(), id) == first.end()) first.push_back(id);
  EXPECT_TRUE(std::is_sorted(first.begin(), first.end()));
  EXPECT_EQ(first.size(), seqs.size());
}

TEST(Scheduler, RespectsMaxNumSeqsAndTheTokenBudget) {
  BlockManager bm(100, 4);
  SchedulerConfig cfg;
  cfg.max_num_seqs = 2;
  cfg.max_num_batched_tokens = 16;
  Scheduler sched(cfg, bm);
  auto seqs = make_requests({{10, 3}, {10, 3}, {10, 3}});
  for (auto& s : seqs) sched.add(s.get());
  const ScheduledBatch first = sched.schedule();
  EXPECT_EQ(sched.running().size(), 2u);
  EXPECT_EQ(first.num_tokens(), 16);  // 10 + 6: the second prompt is chunked
  ASSERT_EQ(first.prefills.size(), 2u);
  EXPECT_EQ(first.prefills[1].len, 6);
  EXPECT_EQ(first.sampling_sequences().size(), 1u);
  EXPECT_THROW(Scheduler(SchedulerConfig{4, 3, false}, bm), Error);
}

TEST(Scheduler, RejectsAMismatchedNumberOfSampledTokens) {
  BlockManager bm(8, 4);
  Scheduler sched(SchedulerConfig{4, 16, false}, bm);
  auto seqs = make_requests({{3, 2}});
  sched.add(seqs[0].get());
  const ScheduledBatch batch = sched.schedule();
  EXPECT_THROW(sched.postprocess(batch, {}), Error);
}

}  // namespace
}  // namespace gqattn::engine
