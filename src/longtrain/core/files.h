// The files a user names as input (configs, token files and their sidecars, model and
// tokenizer files, checkpoints, metrics): read only when they are regular files. Non-obvious:
// they are opened with O_NONBLOCK and checked with fstat on the open descriptor, so a FIFO
// (whose open would block until a writer comes) is refused at once, and a file swapped for
// one between a check and the open cannot slip through.
#pragma once
#include <string>

namespace lt {

// A descriptor (O_RDONLY | O_CLOEXEC) of the regular file `path`; lt::Error naming `what`
// otherwise: missing (with the absolute path tried), a directory, or a FIFO, socket or device
// (which would block or never end).
int openInputFile(const std::string& path, const std::string& what);
// The whole of the regular file `path` (as openInputFile refuses the others).
std::string readInputFile(const std::string& path, const std::string& what);
// lt::Error unless `path` is a regular file, as openInputFile words it (for files a library
// opens itself, such as SentencePiece's model).
void checkInputFile(const std::string& path, const std::string& what);

}  // namespace lt
