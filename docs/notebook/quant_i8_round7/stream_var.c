#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stddef.h>
typedef struct { const uint8_t* p; size_t bytes; int mode; long dist; uint64_t out; } Job;
static void* run(void* arg) {
  Job* j = (Job*)arg; const uint8_t* p = j->p; long d = j->dist;
  __m512i a = _mm512_setzero_si512(), b = _mm512_setzero_si512();
  for (size_t i = 0; i + 128 <= j->bytes; i += 128) {
    if (j->mode == 1) { _mm_prefetch((const char*)p + i + d, _MM_HINT_T0); _mm_prefetch((const char*)p + i + d + 64, _MM_HINT_T0); }
    if (j->mode == 2) { _mm_prefetch((const char*)p + i + d, _MM_HINT_NTA); _mm_prefetch((const char*)p + i + d + 64, _MM_HINT_NTA); }
    if (j->mode == 3) { _mm_prefetch((const char*)p + i + d, _MM_HINT_T1); _mm_prefetch((const char*)p + i + d + 64, _MM_HINT_T1); }
    a = _mm512_xor_si512(a, _mm512_loadu_si512(p + i));
    b = _mm512_xor_si512(b, _mm512_loadu_si512(p + i + 64));
  }
  j->out = (uint64_t)_mm512_reduce_add_epi64(_mm512_xor_si512(a, b));
  return 0;
}
uint64_t stream(const uint8_t* p, size_t bytes, int threads, int mode, long dist) {
  pthread_t t[16]; Job jobs[16]; uint64_t x = 0; size_t share = (bytes / threads) & ~(size_t)127;
  for (int i = 0; i < threads; ++i) { Job j = {p + share * i, share, mode, dist, 0}; jobs[i] = j; }
  for (int i = 1; i < threads; ++i) pthread_create(&t[i], 0, run, &jobs[i]);
  run(&jobs[0]);
  for (int i = 1; i < threads; ++i) pthread_join(t[i], 0);
  for (int i = 0; i < threads; ++i) x ^= jobs[i].out;
  return x;
}
