// bench/heap_sampler.c: an LD_PRELOAD helper for bench/soak.sh and bench/heap_by_instruction.py
// (not linked into longtrain). Every LT_HEAP_SAMPLE_MS (1000) ms it appends to
// LT_HEAP_SAMPLE.rank<RANK> (.pid<pid> for a process without RANK, e.g. the launcher) one line:
// the time (CLOCK_REALTIME, s), tcmalloc's bytes in use by the program, its page heap's free and
// unmapped bytes, the heap's size, the process's RssAnon and RssFile (kB), and the most bytes in
// use at any moment since the previous line (tcmalloc's new/delete hooks; 0 without them). So RSS
// growth can be told apart: a leak grows "in use"; allocator retention grows the free lists while
// "in use" stays flat; and a phase's peak is exact, not what a sample happened to see.
// Non-obvious: tcmalloc is found with dlsym at run time, so without tcmalloc it records RSS only.
// Build: cc -O2 -shared -fPIC -o build/heap_sampler.so bench/heap_sampler.c -ldl -pthread
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int (*GetProp)(const char*, size_t*);
typedef size_t (*GetSize)(const void*);
typedef int (*AddNewHook)(void (*)(const void*, size_t));
typedef int (*AddDeleteHook)(void (*)(const void*));

// Bytes in use by the hooks' count (from the hooks' installation on) and its most since the last line.
static GetSize gSize;
static long gLive, gPeak;

static void onNew(const void* p, size_t n) {
  (void)n;
  if (!p) return;
  long v = __atomic_add_fetch(&gLive, (long)gSize(p), __ATOMIC_RELAXED);
  long peak = __atomic_load_n(&gPeak, __ATOMIC_RELAXED);
  while (v > peak && !__atomic_compare_exchange_n(&gPeak, &peak, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

static void onDelete(const void* p) {
  if (p) __atomic_sub_fetch(&gLive, (long)gSize(p), __ATOMIC_RELAXED);
}

static size_t prop(GetProp get, const char* name) {
  size_t v = 0;
  if (!get || !get(name, &v)) return 0;
  return v;
}

static void rss(long* anon, long* file) {
  char line[256];
  FILE* f = fopen("/proc/self/status", "r");
  *anon = *file = -1;
  if (!f) return;
  while (fgets(line, sizeof line, f)) {
    if (!strncmp(line, "RssAnon:", 8)) *anon = atol(line + 8);
    if (!strncmp(line, "RssFile:", 8)) *file = atol(line + 8);
  }
  fclose(f);
}

static void* loop(void* arg) {
  char path[4096];
  const char* rank = getenv("RANK");
  if (rank && *rank) snprintf(path, sizeof path, "%s.rank%s", (const char*)arg, rank);
  else snprintf(path, sizeof path, "%s.pid%d", (const char*)arg, (int)getpid());
  const char* ms = getenv("LT_HEAP_SAMPLE_MS");
  const long period = ms ? atol(ms) : 1000;
  GetProp get = (GetProp)dlsym(RTLD_DEFAULT, "MallocExtension_GetNumericProperty");
  struct timespec t;
  for (;;) {
    FILE* f = fopen(path, "a");
    if (!f) return NULL;
    long anon, file;
    rss(&anon, &file);
    clock_gettime(CLOCK_REALTIME, &t);
    size_t inUse = prop(get, "generic.current_allocated_bytes");
    // The hooks count from their installation; the peak is placed on tcmalloc's own count.
    long live = __atomic_load_n(&gLive, __ATOMIC_RELAXED);
    long peak = gSize ? __atomic_exchange_n(&gPeak, live, __ATOMIC_RELAXED) : 0;
    long peakInUse = gSize ? (long)inUse + (peak - live) : 0;
    fprintf(f, "%.4f %zu %zu %zu %zu %ld %ld %ld\n", t.tv_sec + t.tv_nsec * 1e-9, inUse,
            prop(get, "tcmalloc.pageheap_free_bytes"), prop(get, "tcmalloc.pageheap_unmapped_bytes"),
            prop(get, "generic.heap_size"), anon, file, peakInUse);
    fclose(f);
    usleep(period * 1000);
  }
  return NULL;
}

__attribute__((constructor)) static void start(void) {
  const char* out = getenv("LT_HEAP_SAMPLE");
  if (!out || !*out) return;
  AddNewHook addNew = (AddNewHook)dlsym(RTLD_DEFAULT, "MallocHook_AddNewHook");
  AddDeleteHook addDelete = (AddDeleteHook)dlsym(RTLD_DEFAULT, "MallocHook_AddDeleteHook");
  GetSize size = (GetSize)dlsym(RTLD_DEFAULT, "MallocExtension_GetAllocatedSize");
  if (addNew && addDelete && size) {
    gSize = size;
    addNew(onNew);
    addDelete(onDelete);
  }
  pthread_t th;
  if (pthread_create(&th, NULL, loop, (void*)out) == 0) pthread_detach(th);
}
