// openInputFile and readInputFile (see files.h).
#include "longtrain/core/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "longtrain/core/check.h"

namespace lt {

namespace {

std::string absoluteOf(const std::string& path) {
  std::error_code ec;
  const auto a = std::filesystem::absolute(path, ec);
  return ec ? path : a.string();
}

// lt::Error naming what `mode` is, unless it is a regular file's.
void refuseIrregular(mode_t mode, const std::string& what) {
  LT_CHECK(!S_ISDIR(mode), what, " is a directory; give the file itself");
  LT_CHECK(S_ISREG(mode), what, " is not a regular file but a ",
           S_ISFIFO(mode) ? "FIFO" : S_ISSOCK(mode) ? "socket" : S_ISCHR(mode) || S_ISBLK(mode) ? "device" : "special file",
           ", which would block or never end; give a regular file");
}

}  // namespace

int openInputFile(const std::string& path, const std::string& what) {
  LT_CHECK(!path.empty(), what, " is empty; give a file");
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    LT_CHECK(err != ENOENT, what, " does not exist (absolute: '", absoluteOf(path), "')");
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) refuseIrregular(st.st_mode, what);  // a socket cannot be opened
    LT_CHECK(false, "cannot open ", what, ": ", std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const mode_t mode = st.st_mode;
    ::close(fd);
    refuseIrregular(mode, what);
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

std::string readInputFile(const std::string& path, const std::string& what) {
  const int fd = openInputFile(path, what);
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      LT_CHECK(n == 0, "cannot read ", what, ": ", std::strerror(err));
      return out;
    }
    out.append(buf, static_cast<size_t>(n));
  }
}

void checkInputFile(const std::string& path, const std::string& what) { ::close(openInputFile(path, what)); }

}  // namespace lt
