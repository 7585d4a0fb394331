-- @include overlap/timeline.sql
-- Iterations per rank, with or without step markers (tier of the tests: tests/test_iterations.py, tier 2 and 3).
-- iteration_source:
--   'marker'        the rank's step markers, one iteration per marker range: the user's marker name when given
--                   (marker := 'train_step': ranges of any kind, NVTX or annotation, named exactly that or that
--                   followed by a number, 'train_step 12', 'train_step#12'; outermost ones only, nested repeats
--                   dropped), else _overlap_steps (Kineto ProfilerStep#N, else NVTX 'step N', 'iteration N',
--                   'iter N', 'train_step N', 'ProfilerStep#N'); use_markers := false ignores every marker (to
--                   check detection against them);
--   'detected'      no marker on the rank: the repeating unit of its communication and GEMM kernel names;
--   'whole_capture' neither: the rank's whole capture is one iteration.
-- Detection (per rank without markers):
--   1. The sequence: the rank's communication and GEMM kernels (kernel_class 'communication' or 'gemm') on one
--      stream, in start order, each a token (its full name). One stream, the one with the most such kernels, because
--      a stream runs its kernels in issue order: across streams two interleaved groups (say a TP all_reduce stream
--      and a DP reduce_scatter stream) swap order from one iteration to the next with timing jitter, which breaks
--      any exact repetition of the merged sequence.
--   2. Candidate periods p: the distances from each token to its 1st .. 16th previous occurrence (a token that
--      occurs m <= 16 times per iteration recurs exactly p apart at its m-th previous occurrence, so nearly every
--      position votes for the true period even when no kernel occurs once per iteration), the 64 most frequent,
--      p <= n / 2.
--   3. score(p) = share of positions i >= p whose token equals the token at i − p.
--   4. The period: the smallest candidate whose score is >= min_score (default 0.9) and within 0.01 of the best
--      score (the multiples 2p, 3p of the true period score as well as p; a sub-period such as one layer of a
--      many-layer model scores lower, because it breaks at every layer boundary that is also an iteration
--      boundary). None: the rank is 'whole_capture'.
--   5. Warm-up: the periodic part starts at s0, the first position whose next p tokens all equal the p after them
--      (the first run of p consecutive matches begins at s0 + p). Boundaries are s0 + k·p (k >= 1) for as long as
--      that position holds the token of s0 (a last iteration that differs ends the series; its kernels stay in the
--      last iteration), and s0 itself when s0 >= p / 2 (a warm-up at least half an iteration long is an iteration
--      of its own; a shorter one joins the first iteration).
--   6. Cross-check: ranks_agree says whether every detected rank found the same number of iterations.
-- Stage 2 (detected_from 'collective_bags'), on ranks where stage 1 finds no period (a loop whose GEMM order changes
-- from one iteration to the next: HTA's sampled 2-rank trace, where 23 % of positions repeat at the step length):
--   1. The sequence: the rank's communication kernels on every stream, in start order; a token is the collective
--      and its process group (comm_ops; the kernel name where there is no comm_ops row). Every step runs the same
--      collectives, but their order may change (two streams, sampling, a data-dependent branch).
--   2. Candidate periods as in stage 1. A position i is a boundary for p when the bags (multisets) of tokens of
--      [i − p, i) and [i, i + p) are equal: prefix sums of a 64-bit hash per token compare two bags in one step
--      (one row per position and candidate; no pair of kernels is compared).
--   3. For each p, the longest run of consecutive boundaries i0, i0 + p, ... (r of them; then the earliest) makes
--      r + 1 equal units from s0 = i0 − p; score(p) = (r + 1)·p / n, the share of the sequence they cover.
--   4. The period: the smallest candidate with score >= min_score and within 0.01 of the best whose first unit
--      holds at least two different tokens (a repeated single collective, DDP's bucketed all_reduces, has no
--      structure a period can be read from: the rank stays whole_capture). Boundaries: s0 + k·p for k = 1 .. r, s0
--      itself when s0 >= p / 2 (as in stage 1), and s0 + (r + 1)·p when at least p / 2 kernels follow it (a last
--      iteration that differs). The boundaries are communication kernels: an iteration starts at its first
--      collective, and the compute before it counts in the previous one.
-- Known limits: a sub-period that explains >= 99 % of the sequence (a model of 100 identical layers with nothing
-- else in the loop) is taken for the iteration; a loop whose collectives as well as its GEMMs change from one
-- iteration to the next is not found, and stays whole_capture; markers avoid both.

-- @macro _lateness_epsilon_ns
-- Default of epsilon_ns (ns), the launch latency allowance of late_arrival_causes, late_rank_host_ops,
-- rank_iteration_breakdown and iteration_trend: 10 µs.
CREATE OR REPLACE MACRO _lateness_epsilon_ns() AS 10000;

-- @macro _lateness_min_score
-- Default of min_score, the share of the sequence a detected period must explain (iterations and the macros
-- that forward it): 0.9.
CREATE OR REPLACE MACRO _lateness_min_score() AS 0.9;

-- @macro iterations
-- Iteration boundaries per rank: from step markers, else detected from the repeating communication and GEMM kernel
-- sequence, else the whole capture (algorithm in the description of queries/lateness/iterations.sql). Times are on
-- the rank's own clock (the job timeline of its file, as cpu_ranges and kernels).
-- @param min_score: Smallest share of the sequence that a detected period must explain (0..1, default 0.9).
-- @param marker: Name of the user's iteration range (NVTX or annotation), e.g. 'train_step'; ranges named exactly
-- that or that plus a number. Ranks without it fall back to ProfilerStep/NVTX step markers. '' (default): none.
-- @param use_markers: false: ignore every marker and detect (or take the whole capture) on every rank.
-- @column rank [key]: Rank.
-- @column iteration [key]: 0, 1, ... in start order on the rank.
-- @column step_no [key]: The marker's number N (ProfilerStep#N, train_step 12); NULL when it has none, when detected or
-- whole_capture.
-- @column iteration_source [key]: 'marker', 'detected' or 'whole_capture'.
-- @column start_ns: Iteration start (ns): the marker's start; detected: the start of the iteration's first kernel of
-- the detected sequence (iteration 0: the rank's first kernel); whole_capture: the rank's first kernel.
-- @column end_ns: Iteration end (ns): the marker's end; detected: the next iteration's start (the last one: the
-- rank's last kernel end); whole_capture: the rank's last kernel end.
-- @column first_kernel_id: detected: the boundary kernel (the anchor token's kernel) starting the iteration, NULL
-- for iteration 0 and for the other sources.
-- @column period_kernels: detected: kernels of the detected sequence per iteration (p); else NULL.
-- @column period_score_pct [key]: detected: 100 × score(p) (collective_bags: the share of the communication
-- kernels in the run of equal bags); else NULL.
-- @column warmup_kernels: detected: kernels of the sequence before the periodic part (s0); else NULL.
-- @column stream_id: detected from kernel_names: the stream whose sequence was used; else NULL.
-- @column detected_from: detected: 'kernel_names' (stage 1: the order of one stream's communication and GEMM kernel
-- names repeats) or 'collective_bags' (stage 2: the rank's communication kernels, every stream, repeat as bags of
-- collectives whose order may change); NULL for the other sources.
-- @column rank_iterations: Iterations on this rank.
-- @column ranks_agree: detected: every detected rank found the same number of iterations; NULL for other sources.
CREATE OR REPLACE MACRO iterations(min_score := _lateness_min_score(), marker := '', use_markers := true) AS TABLE
WITH um AS (  -- the user's marker ranges: outermost ones (not starting inside an earlier one on the rank)
  SELECT rank, name, start_ns, end_ns FROM cpu_ranges
  WHERE coalesce(marker, '') <> '' AND end_ns IS NOT NULL AND end_ns >= start_ns AND kind <> 'python_function'
    AND (name = marker OR (starts_with(name, marker)
                           AND regexp_matches(substr(name, length(marker) + 1), '^[ _#:]*[0-9]+$')))
  QUALIFY coalesce(start_ns >= max(end_ns) OVER (PARTITION BY rank ORDER BY start_ns, end_ns DESC, range_id
                                                 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), true)
), steps AS (
  SELECT rank, TRY_CAST(regexp_extract(name, '([0-9]+)$', 1) AS BIGINT) AS step_no, start_ns AS step_start_ns,
         end_ns AS step_end_ns
  FROM um WHERE use_markers
  UNION ALL
  SELECT rank, step_no, step_start_ns, step_end_ns FROM _overlap_steps()
  WHERE use_markers AND rank NOT IN (SELECT rank FROM um)
), mk AS (SELECT DISTINCT rank FROM steps),
kr AS (SELECT rank, min(start_ns) AS first_ns, max(end_ns) AS last_ns FROM kernels GROUP BY rank),
cg AS (
  SELECT rank, stream_id, kernel_id, start_ns, name AS tok FROM kernels
  WHERE kernel_class IN ('communication', 'gemm') AND rank NOT IN (SELECT rank FROM mk)
), st AS (  -- the stream with the most communication and GEMM kernels (ties: the lowest stream id)
  SELECT rank, arg_min(stream_id, (-cnt, stream_id)) AS stream_id
  FROM (SELECT rank, stream_id, count(*) AS cnt FROM cg GROUP BY ALL) GROUP BY rank
), seq AS (
  SELECT cg.rank, cg.stream_id, cg.kernel_id, cg.start_ns, cg.tok,
         row_number() OVER (PARTITION BY cg.rank ORDER BY cg.start_ns, cg.kernel_id) - 1 AS i
  FROM cg JOIN st USING (rank, stream_id)
), n AS (SELECT rank, count(*) AS n FROM seq GROUP BY rank
), dist AS (  -- distances to the 16 previous occurrences of the same token (one window pass)
  SELECT rank, i - unnest(prev) AS p
  FROM (SELECT rank, i, list(i) OVER (PARTITION BY rank, tok ORDER BY i
                                      ROWS BETWEEN 16 PRECEDING AND 1 PRECEDING) AS prev FROM seq)
), cand AS (
  SELECT d.rank, d.p FROM dist d JOIN n USING (rank)
  WHERE d.p IS NOT NULL AND 2 * d.p <= n.n
  GROUP BY d.rank, d.p
  QUALIFY row_number() OVER (PARTITION BY d.rank ORDER BY count(*) DESC, d.p) <= 64
), score AS (  -- position i matches period p: the same token p positions earlier (aggregated as the join streams:
  -- kept, 64 rows per position were materialized for the one period picked below)
  SELECT c.rank, c.p, avg((s.tok = b.tok)::INT) AS score
  FROM cand c JOIN seq s ON s.rank = c.rank AND s.i >= c.p
  JOIN seq b ON b.rank = s.rank AND b.i = s.i - c.p
  GROUP BY c.rank, c.p
), pick AS (
  SELECT rank, min(p) FILTER (WHERE score >= min_score AND score >= best - 0.01) AS p
  FROM (SELECT *, max(score) OVER (PARTITION BY rank) AS best FROM score) GROUP BY rank
), m AS (  -- the matches of the chosen period
  SELECT pk.rank, pk.p, s.i, s.tok = b.tok AS ok
  FROM pick pk JOIN seq s ON s.rank = pk.rank AND s.i >= pk.p
  JOIN seq b ON b.rank = s.rank AND b.i = s.i - pk.p
), runs AS (  -- runs of consecutive matches for the chosen period (gaps and islands)
  SELECT m.rank, m.p, m.i, m.ok,
         m.i - row_number() OVER (PARTITION BY m.rank, m.ok ORDER BY m.i) AS island
  FROM m
), s0 AS (
  SELECT rank, any_value(p) AS p, min(i0) - any_value(p) AS s0
  FROM (SELECT rank, p, island, min(i) AS i0, count(*) AS len FROM runs WHERE ok GROUP BY ALL)
  WHERE len >= p GROUP BY rank
), anchor AS (SELECT s0.*, s.tok AS a FROM s0 JOIN seq s ON s.rank = s0.rank AND s.i = s0.s0
), kb AS (  -- candidate boundaries s0 + k·p, kept up to the first that misses the anchor token; the position is a
  -- column before the join, so that the join is on equal keys (an expression in the condition made it compare
  -- every boundary with every position of the rank)
  SELECT x.rank, x.p, x.s0, x.k, s.kernel_id, s.start_ns, coalesce(s.tok = x.a, false) AS hit
  FROM (SELECT *, s0 + k * p AS pos
        FROM (SELECT a.rank, a.p, a.s0, a.a,
                     unnest(range(CASE WHEN 2 * a.s0 >= a.p THEN 0 ELSE 1 END, n.n // a.p + 1)) AS k
              FROM anchor a JOIN n USING (rank))) x
  LEFT JOIN seq s ON s.rank = x.rank AND s.i = x.pos
), bnd AS (
  SELECT rank, p, s0, kernel_id, start_ns FROM kb
  QUALIFY bool_and(hit) OVER (PARTITION BY rank ORDER BY k ROWS UNBOUNDED PRECEDING) AND start_ns IS NOT NULL
), det AS (
  SELECT b.rank, b.kernel_id AS first_kernel_id, b.start_ns, b.p, b.s0 FROM bnd b
  UNION ALL  -- iteration 0 from the rank's first kernel (the warm-up, or kernels before the first boundary)
  SELECT s0.rank, NULL, kr.first_ns, s0.p, s0.s0 FROM s0 JOIN kr USING (rank)
  WHERE kr.first_ns < coalesce((SELECT min(start_ns) FROM bnd WHERE bnd.rank = s0.rank), kr.first_ns + 1)
), cseq AS (  -- stage 2 (ranks stage 1 did not detect): the communication kernels of every stream, as bags
  SELECT k.rank, k.kernel_id, k.start_ns,
         hash(coalesce(o.collective, k.name) || '|' || coalesce(o.pg_name, '')) AS h,
         coalesce(o.collective, k.name) || '|' || coalesce(o.pg_name, '') AS tok,
         row_number() OVER (PARTITION BY k.rank ORDER BY k.start_ns, k.kernel_id) - 1 AS i
  FROM kernels k LEFT JOIN comm_ops o USING (kernel_id)
  WHERE k.kernel_class = 'communication' AND k.rank NOT IN (SELECT rank FROM mk)
    AND k.rank NOT IN (SELECT rank FROM s0)
), cn AS (SELECT rank, count(*) AS n FROM cseq GROUP BY rank
), cpre AS (  -- H(i): sum of the token hashes before position i (a bag of positions [a, b) is H(b) - H(a))
  SELECT rank, i, sum(h::HUGEINT) OVER (PARTITION BY rank ORDER BY i) - h::HUGEINT AS hb FROM cseq
  UNION ALL SELECT rank, any_value(n), sum(h::HUGEINT) FROM cseq JOIN cn USING (rank) GROUP BY rank
), ccand AS (
  SELECT d.rank, d.p FROM (
    SELECT rank, i - unnest(prev) AS p
    FROM (SELECT rank, i, list(i) OVER (PARTITION BY rank, tok ORDER BY i
                                        ROWS BETWEEN 16 PRECEDING AND 1 PRECEDING) AS prev FROM cseq)) d
  JOIN cn USING (rank)
  WHERE d.p IS NOT NULL AND 2 * d.p <= cn.n
  GROUP BY d.rank, d.p
  QUALIFY row_number() OVER (PARTITION BY d.rank ORDER BY count(*) DESC, d.p) <= 64
), cm AS (  -- position i splits two equal bags of p: [i - p, i) and [i, i + p)
  SELECT c.rank, c.p, x.i, x.i % c.p AS phase, (x.hb - a.hb) = (b.hb - x.hb) AS ok
  FROM ccand c JOIN cn USING (rank) JOIN cpre x ON x.rank = c.rank AND x.i >= c.p AND x.i + c.p <= cn.n
  JOIN cpre a ON a.rank = x.rank AND a.i = x.i - c.p
  JOIN cpre b ON b.rank = x.rank AND b.i = x.i + c.p
), cruns AS (  -- runs of consecutive equal-bag boundaries per (period, phase)
  SELECT rank, p, phase, min(i) AS i0, count(*) AS r
  FROM (SELECT *, i // p - row_number() OVER (PARTITION BY rank, p, phase ORDER BY i) AS isl FROM cm WHERE ok)
  GROUP BY rank, p, phase, isl
), cbest AS (  -- per period: its longest run (then the earliest); coverage = the r + 1 equal units' share
  SELECT cr.rank, cr.p, cr.i0 - cr.p AS s0, cr.r, (cr.r + 1) * cr.p / cn.n AS score
  FROM cruns cr JOIN cn USING (rank)
  QUALIFY row_number() OVER (PARTITION BY cr.rank, cr.p ORDER BY cr.r DESC, cr.i0) = 1
), cpick AS (
  SELECT * FROM (SELECT *, max(score) OVER (PARTITION BY rank) AS best FROM cbest) b
  WHERE score >= min_score AND score >= best - 0.01
    AND (SELECT count(DISTINCT s.tok) FROM cseq s WHERE s.rank = b.rank AND s.i >= b.s0 AND s.i < b.s0 + b.p) >= 2
  QUALIFY row_number() OVER (PARTITION BY rank ORDER BY p) = 1
), cdet AS (  -- boundaries: s0 (when s0 >= p / 2), s0 + p .. s0 + r·p, and s0 + (r + 1)·p when it starts a part of
  -- at least p / 2 kernels (a last iteration that differs)
  SELECT c.rank, s.kernel_id AS first_kernel_id, s.start_ns, c.p, c.s0, c.score
  FROM cpick c JOIN cn USING (rank)
  JOIN cseq s ON s.rank = c.rank AND s.i >= c.s0 AND (s.i - c.s0) % c.p = 0
  WHERE (s.i > c.s0 OR 2 * c.s0 >= c.p) AND (s.i <= c.s0 + c.r * c.p OR 2 * (cn.n - s.i) >= c.p)
    AND s.i <= c.s0 + (c.r + 1) * c.p
  UNION ALL
  SELECT c.rank, NULL, kr.first_ns, c.p, c.s0, c.score FROM cpick c JOIN kr USING (rank)
), det_rows AS (
  SELECT d.rank, NULL::BIGINT AS step_no, 'detected' AS iteration_source, d.start_ns,
         coalesce(lead(d.start_ns) OVER (PARTITION BY d.rank ORDER BY d.start_ns), kr.last_ns) AS end_ns,
         d.first_kernel_id, d.p AS period_kernels, 100.0 * sc.score AS period_score_pct, d.s0 AS warmup_kernels,
         st.stream_id, 'kernel_names' AS detected_from
  FROM det d JOIN kr USING (rank) JOIN st USING (rank) JOIN score sc ON sc.rank = d.rank AND sc.p = d.p
  UNION ALL
  SELECT d.rank, NULL, 'detected', d.start_ns,
         coalesce(lead(d.start_ns) OVER (PARTITION BY d.rank ORDER BY d.start_ns), kr.last_ns),
         d.first_kernel_id, d.p, 100.0 * d.score, d.s0, NULL, 'collective_bags'
  FROM (SELECT * FROM cdet QUALIFY row_number() OVER (PARTITION BY rank, start_ns ORDER BY first_kernel_id NULLS FIRST)
        = 1) d
  JOIN kr USING (rank)
), mark_rows AS (
  SELECT rank, step_no, 'marker' AS iteration_source, step_start_ns AS start_ns, step_end_ns AS end_ns,
         NULL::BIGINT AS first_kernel_id, NULL::BIGINT AS period_kernels, NULL::DOUBLE AS period_score_pct,
         NULL::BIGINT AS warmup_kernels, NULL::BIGINT AS stream_id, NULL::VARCHAR AS detected_from
  FROM steps
), whole AS (
  SELECT kr.rank, NULL::BIGINT, 'whole_capture', kr.first_ns, kr.last_ns, NULL::BIGINT, NULL::BIGINT,
         NULL::DOUBLE, NULL::BIGINT, NULL::BIGINT, NULL::VARCHAR
  FROM kr WHERE rank NOT IN (SELECT rank FROM mk) AND rank NOT IN (SELECT rank FROM det_rows)
), allr AS (SELECT * FROM mark_rows UNION ALL SELECT * FROM det_rows UNION ALL SELECT * FROM whole
), cnt AS (SELECT *, count(*) OVER (PARTITION BY rank) AS rank_iterations FROM allr)
SELECT rank, (row_number() OVER (PARTITION BY rank ORDER BY start_ns, end_ns, step_no, first_kernel_id) - 1)::BIGINT
         AS iteration, step_no,
       iteration_source, start_ns, end_ns, first_kernel_id, period_kernels, period_score_pct::DOUBLE AS period_score_pct,
       warmup_kernels, stream_id, detected_from, rank_iterations,
       CASE WHEN iteration_source = 'detected'
            THEN (SELECT count(DISTINCT rank_iterations) = 1 FROM cnt c2 WHERE c2.iteration_source = 'detected') END
         AS ranks_agree
FROM cnt
ORDER BY rank, iteration;
