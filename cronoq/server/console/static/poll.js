// Calling `task` now and again every `period` ms until stopped; a failure is reported and retried
// at the next tick. The returned stop function also has `now()`, to refresh at once.

export function every(period, task, onError) {
  let stopped = false;
  let running = false;
  let again = false;
  let timer = null;
  const controller = new AbortController();

  async function tick() {
    running = true;
    try {
      await task(controller.signal);
    } catch (error) {
      if (!stopped && onError) onError(error);
    }
    running = false;
    if (stopped) return;
    timer = setTimeout(tick, again ? 0 : period);
    again = false;
  }

  function stop() {
    stopped = true;
    clearTimeout(timer);
    controller.abort();
  }
  stop.now = () => {
    if (stopped) return;
    if (running) {
      again = true;
    } else {
      clearTimeout(timer);
      timer = setTimeout(tick, 0);
    }
  };
  tick();
  return stop;
}
