// Not built: the clang builds compile it with -fsyntax-only to show that the thread-safety
// analysis is on (ctest `thread_safety_analysis`): reading a field without its mutex must be
// reported.
#include "base/mutex.h"

namespace ferry {

class Unguarded {
 public:
  int Read() { return n_; }  // reads n_ without holding mu_

 private:
  Mutex mu_;
  int n_ GUARDED_BY(mu_) = 0;
};

int Use() {
  Unguarded u;
  return u.Read();
}

}  // namespace ferry
