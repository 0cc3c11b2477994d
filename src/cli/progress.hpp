// A one-line progress bar on stderr, drawn only when stderr is a terminal
// (`quantize`, `dequantize`, `convert`). Lines of text said through it go
// above the bar when there is one, and to stderr as they are when not.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <string>

namespace nvfp4moe::cli {

class Progress {
 public:
  explicit Progress(const char* what) : what_(what), tty_(::isatty(2) != 0) {}
  ~Progress() { finish(); }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void set_total(size_t n) {
    total_ = n;
    done_ = 0;
  }
  // One more of the total done, in `label` (a file name).
  void tick(const std::string& label) { show(done_ + 1, total_, label); }
  // done of total, in `label`.
  void show(size_t done, size_t total, const std::string& label) {
    done_ = done;
    total_ = total;
    label_ = label;
    draw();
  }
  // The bar's line ended, so that what follows starts on a line of its own.
  void finish() {
    if (drawn_) std::fputc('\n', stderr);
    drawn_ = false;
  }
  // A line of its own: above the bar on a terminal, else as it is.
  void say(const std::string& line) {
    if (drawn_) std::fputs("\r\033[K", stderr);  // the bar's line cleared
    std::fprintf(stderr, "%s\n", line.c_str());
    drawn_ = false;
    draw();
  }

 private:
  void draw() {
    if (!tty_ || total_ == 0) return;
    const size_t width = 30, filled = width * (done_ < total_ ? done_ : total_) / total_;
    std::fprintf(stderr, "\r%s %s [%.*s%*s] %zu/%zu", what_, label_.c_str(), int(filled),
                 "##############################", int(width - filled), "", done_, total_);
    std::fflush(stderr);
    drawn_ = true;
  }

  const char* what_;
  bool tty_, drawn_ = false;
  size_t total_ = 0, done_ = 0;
  std::string label_;
};

}  // namespace nvfp4moe::cli
