// What the C++ check files share (tests/cpp: api_checks.cpp, problem_checks.cpp,
// scheduler_checks.cpp, kvcache_checks.cpp).
#pragma once

namespace flashattn_cu_checks {

// Prints "ok" or "FAIL" with `what` and counts the failures (api_checks.cpp; its exit status).
void expect(bool ok, const char* what);

// problem_checks.cpp: the problem layer's host-callable math, by brute force.
void run_problem_checks();

// scheduler_checks.cpp: the tile scheduler's host-callable math (problem/scheduler.h).
void run_scheduler_checks();

// kvcache_checks.cpp: the KV-cache side's host-callable math and the decode kernel's rules.
void run_kvcache_checks();

}  // namespace flashattn_cu_checks
