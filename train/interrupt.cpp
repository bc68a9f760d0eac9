// The interrupt flag and its handler (see interrupt.h).
#include "train/interrupt.h"
#include <atomic>
#include <unistd.h>

namespace duet::app {

namespace {
std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler may only touch lock-free atomics");

extern "C" void on_interrupt(int sig) {
  if (g_signal.exchange(sig) != 0) {
    // The second signal: the user does not want to wait for the step and the checkpoint.
    static const char msg[] = "\nduet: second interrupt: exiting now, without a checkpoint\n";
    (void)!::write(STDERR_FILENO, msg, sizeof msg - 1);
    ::_exit(128 + sig);
  }
  static const char msg[] = "\nduet: interrupted: finishing the step and writing the checkpoint (interrupt again to "
                            "exit at once)\n";
  (void)!::write(STDERR_FILENO, msg, sizeof msg - 1);
}
}  // namespace

InterruptGuard::InterruptGuard() {
  g_signal.store(0);
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // reads and writes in progress go on; the flag is polled between steps
  ::sigaction(SIGINT, &sa, &old_int_);
  ::sigaction(SIGTERM, &sa, &old_term_);
}

InterruptGuard::~InterruptGuard() {
  ::sigaction(SIGINT, &old_int_, nullptr);
  ::sigaction(SIGTERM, &old_term_, nullptr);
  g_signal.store(0);
}

int interrupt_signal() { return g_signal.load(std::memory_order_relaxed); }

const char* signal_label(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal"; }

}  // namespace duet::app
