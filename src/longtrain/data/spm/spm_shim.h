// The C interface of liblongtrain_sentencepiece.so, the one place SentencePiece is linked.
// Non-obvious: tokenizer.cpp loads it with dlopen(RTLD_LOCAL | RTLD_DEEPBIND) instead of linking
// libsentencepiece, whose Debian build exports its bundled (older) protobuf: linked into a
// libtorch program it interposes libprotobuf's symbols and every process crashes in protobuf's
// static initialisers (SIGSEGV before main). Only C types cross: every buffer is the caller's.
#pragma once
#include <stddef.h>

extern "C" {

// Every function returning int gives 0 on success, else -1 with a message in err[errCap].
// A size-returning call whose buffer is too small sets *needed and returns 1 (call again).
typedef struct LtSpm LtSpm;

LtSpm* ltspm_load(const char* path, char* err, size_t errCap);  // nullptr on failure
void ltspm_free(LtSpm* m);
int ltspm_piece_size(const LtSpm* m);
int ltspm_bos_id(const LtSpm* m);  // -1: none
int ltspm_eos_id(const LtSpm* m);
int ltspm_is_byte(const LtSpm* m, int id);
// The piece's bytes into buf (not terminated); *needed = its length.
int ltspm_piece(const LtSpm* m, int id, char* buf, size_t cap, size_t* needed);
int ltspm_encode(const LtSpm* m, const char* text, size_t len, int* ids, size_t cap, size_t* needed, char* err,
                 size_t errCap);
int ltspm_decode(const LtSpm* m, const int* ids, size_t n, char* text, size_t cap, size_t* needed, char* err,
                 size_t errCap);
// SentencePieceTrainer::Train with flags keys[i]=values[i], after SetRandomGeneratorSeed(seed).
int ltspm_train(const char* const* keys, const char* const* values, size_t n, unsigned seed, char* err,
                size_t errCap);

// The function table tokenizer.cpp resolves with dlsym.
#define LTSPM_FUNCTIONS(X)                                                                             \
  X(ltspm_load) X(ltspm_free) X(ltspm_piece_size) X(ltspm_bos_id) X(ltspm_eos_id) X(ltspm_is_byte)     \
  X(ltspm_piece) X(ltspm_encode) X(ltspm_decode) X(ltspm_train)
}
