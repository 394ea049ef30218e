// Real child processes for the queue tests: fork + exec with stdout/stderr captured through
// pipes. Small on purpose; only what the tests need.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace moebatch::test {

/// A running child with its stdout readable line by line; killed and reaped on destruction.
class Child {
 public:
  /// Starts argv[0] with argv; stderr is inherited so helper diagnostics reach the test log.
  explicit Child(const std::vector<std::string>& argv) {
    int fds[2];
    if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      dup2(fds[1], STDOUT_FILENO);
      close(fds[0]);
      close(fds[1]);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    close(fds[1]);
    out_ = fds[0];
  }
  ~Child() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_ >= 0) close(out_);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  /// Next stdout line (without '\n'); empty string at EOF or after timeout_ms.
  std::string read_line(int timeout_ms = 20000) {
    std::string line;
    char c;
    while (true) {
      pollfd p{out_, POLLIN, 0};
      if (poll(&p, 1, timeout_ms) <= 0) return line;
      if (read(out_, &c, 1) != 1 || c == '\n') return line;
      line.push_back(c);
    }
  }
  /// Sends sig.
  void signal(int sig) { kill(pid_, sig); }
  /// Waits for exit; returns the raw waitpid status.
  int wait() {
    int status = 0;
    waitpid(pid_, &status, 0);
    reaped_ = true;
    return status;
  }
  /// Process id.
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  bool reaped_ = false;
};

/// Output and exit status of a finished command.
struct RunResult {
  int exit_code = -1;  ///< exit status, or -1 when killed by a signal
  std::string out;     ///< all of stdout
  std::string err;     ///< all of stderr
};

/// Runs argv to completion, capturing stdout and stderr.
inline RunResult run_command(const std::vector<std::string>& argv) {
  int out_fd[2], err_fd[2];
  if (pipe(out_fd) != 0 || pipe(err_fd) != 0) throw std::runtime_error("pipe failed");
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    dup2(out_fd[1], STDOUT_FILENO);
    dup2(err_fd[1], STDERR_FILENO);
    for (int fd : {out_fd[0], out_fd[1], err_fd[0], err_fd[1]}) close(fd);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(out_fd[1]);
  close(err_fd[1]);
  RunResult r;
  pollfd fds[2] = {{out_fd[0], POLLIN, 0}, {err_fd[0], POLLIN, 0}};
  int open_fds = 2;
  char buf[4096];
  // Drain both pipes together so a child filling one cannot deadlock against us.
  while (open_fds > 0) {
    if (poll(fds, 2, 60000) <= 0) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP))) continue;
      ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n <= 0) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      } else {
        (i == 0 ? r.out : r.err).append(buf, static_cast<size_t>(n));
      }
    }
  }
  int status = 0;
  waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace moebatch::test
