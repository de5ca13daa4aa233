// Text helpers of the commands that take or print text: token ids and separators as a user
// types them, and the printing of generated text as it comes. Non-obvious: TextStream decodes
// the whole sequence each time and prints only the new suffix, because a SentencePiece decode
// joins pieces (and drops a leading space), so decoding token by token would print wrong text.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "longtrain/data/tokenizer.h"

namespace lt::data {

// A separator as typed ('%\n'): \n, \t, \r and \\ are escapes; others are an error naming `flag`.
std::string unescapeSeparator(const std::string& s, const std::string& flag);

// Prints the prompt's text, then each new token's text as it is added (to stdout, flushed).
class TextStream {
 public:
  TextStream(const Tokenizer& tok, std::vector<int64_t> prompt);
  void add(int64_t id);

 private:
  const Tokenizer& tok_;
  std::vector<int64_t> ids_;
  std::string shown_;
};

}  // namespace lt::data
