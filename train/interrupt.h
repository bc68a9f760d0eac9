// Clean stops on SIGINT (Ctrl-C) and SIGTERM (what a cluster scheduler sends before it kills):
// the handler only records the signal; the trainer polls it between steps, writes a checkpoint
// it can resume from exactly, and returns. A second signal exits at once (status 128 + signal).
#pragma once
#include <csignal>

namespace duet::app {

// Installs the handlers for its lifetime (the previous ones come back after) and clears the flag.
class InterruptGuard {
public:
  InterruptGuard();
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;

private:
  struct sigaction old_int_ {}, old_term_ {};
};

// The signal received since the guard was installed (SIGINT or SIGTERM), or 0.
int interrupt_signal();
// "SIGINT" / "SIGTERM".
const char* signal_label(int sig);

}  // namespace duet::app
