// Follows the agent's event stream (`GET /v1/event/stream`, newline-delimited JSON) with
// fetch() and a stream reader, so it can send the token header (EventSource cannot). After a
// drop it reconnects with the last index it saw, waiting longer after each failure.

import { apiFetch, errorOf } from './api.js';

/** The heartbeat the page asks for; a stream silent for HEARTBEAT_MS * 3 counts as dropped. */
const HEARTBEAT = '5s';
const HEARTBEAT_MS = 5000;
/** Waits between reconnections: doubled after each failure, from MIN to MAX. */
const MIN_DELAY_MS = 250;
const MAX_DELAY_MS = 15000;
/** A line longer than this ends the connection (the agent's lines are far shorter). */
const MAX_LINE_CHARS = 8 * 1024 * 1024;
/** Events of the past the feed reads back when it starts, for "recent events". */
const BACKFILL = 25;
const BACKFILL_TIMEOUT_MS = 5000;

/**
 * handlers: onEvents(events) for each line of events; onMissed({From, To}) when events left the
 * agent's window before they were read; onConnected() each time the stream (re)starts;
 * onState(state, detail) with `connecting`, `live`, `reconnecting` or `unavailable`;
 * onBackfill(events) once with up to BACKFILL past events, oldest first.
 */
export class EventFeed {
  constructor(handlers) {
    this.h = handlers;
    this.index = null;
    this.stopped = false;
    this.controller = null;
    this.skipWait = false;
    this.wake = null;
  }

  start() {
    this.run();
  }

  stop() {
    this.stopped = true;
    if (this.controller) this.controller.abort();
  }

  /** Reconnects now (after the token changed), without waiting out a backoff. */
  restart() {
    this.skipWait = true;
    if (this.wake) this.wake();
    else if (this.controller) this.controller.abort();
  }

  async run() {
    let delay = MIN_DELAY_MS;
    let first = true;
    while (!this.stopped) {
      const controller = new AbortController();
      this.controller = controller;
      this.h.onState(first ? 'connecting' : 'reconnecting', '');
      let reason = '';
      try {
        const q = new URLSearchParams({ heartbeat: HEARTBEAT });
        if (this.index !== null) q.set('index', String(this.index));
        const resp = await apiFetch('/v1/event/stream?' + q, {
          signal: controller.signal,
          headers: { Accept: 'application/x-ndjson' },
        });
        if (resp.status === 404) {
          const e = await errorOf(resp);
          this.h.onState('unavailable', e.message);
          return;
        }
        if (!resp.ok) throw await errorOf(resp);
        if (this.index === null) {
          const head = resp.headers.get('x-berth-index');
          if (head && /^[0-9]+$/.test(head)) {
            this.index = Number(head);
            if (first) this.backfill(this.index);
          }
        }
        first = false;
        delay = MIN_DELAY_MS;
        this.h.onState('live', '');
        this.h.onConnected();
        await this.read(resp.body, controller);
        reason = 'the stream ended';
      } catch (e) {
        reason = e && e.message ? e.message : String(e);
      }
      if (this.stopped) return;
      if (!this.skipWait) {
        this.h.onState('reconnecting', reason);
        await new Promise((resolve) => {
          this.wake = resolve;
          setTimeout(resolve, delay);
        });
        this.wake = null;
        delay = Math.min(delay * 2, MAX_DELAY_MS);
      }
      if (this.skipWait) {
        this.skipWait = false;
        delay = MIN_DELAY_MS;
      }
    }
  }

  /** Reads lines until the stream ends, fails, or stays silent too long. */
  async read(body, controller) {
    const reader = body.getReader();
    const decoder = new TextDecoder();
    let buffer = '';
    let watchdog = null;
    const arm = () => {
      clearTimeout(watchdog);
      watchdog = setTimeout(() => controller.abort(), HEARTBEAT_MS * 3);
    };
    arm();
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        arm();
        buffer += decoder.decode(value, { stream: true });
        let nl;
        while ((nl = buffer.indexOf('\n')) >= 0) {
          const line = buffer.slice(0, nl).trim();
          buffer = buffer.slice(nl + 1);
          if (line) this.line(JSON.parse(line));
        }
        if (buffer.length > MAX_LINE_CHARS) throw new Error('a line of the event stream is too long');
      }
    } finally {
      clearTimeout(watchdog);
      reader.cancel().catch(() => {});
    }
  }

  line(obj) {
    if (obj && Array.isArray(obj.Events)) {
      if (typeof obj.Index === 'number') this.index = obj.Index;
      this.h.onEvents(obj.Events);
    } else if (obj && obj.Missed) {
      if (typeof obj.Missed.To === 'number') this.index = obj.Missed.To;
      this.h.onMissed(obj.Missed);
    }
    // Anything else is a heartbeat ({}).
  }

  /** Reads the last BACKFILL events up to `upTo` on a connection of its own, then closes it. */
  async backfill(upTo) {
    if (upTo <= 0) return;
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(), BACKFILL_TIMEOUT_MS);
    const events = [];
    try {
      const q = new URLSearchParams({ index: String(Math.max(0, upTo - BACKFILL)), heartbeat: '1s' });
      const resp = await apiFetch('/v1/event/stream?' + q, { signal: controller.signal });
      if (!resp.ok) return;
      const reader = resp.body.getReader();
      const decoder = new TextDecoder();
      let buffer = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let nl;
        let reached = false;
        while ((nl = buffer.indexOf('\n')) >= 0) {
          const line = buffer.slice(0, nl).trim();
          buffer = buffer.slice(nl + 1);
          if (!line) continue;
          const obj = JSON.parse(line);
          if (Array.isArray(obj.Events)) {
            for (const e of obj.Events) if (e.Index <= upTo) events.push(e);
            if (obj.Index >= upTo) reached = true;
          } else if (!obj.Missed) {
            reached = true; // a heartbeat: nothing more before `upTo`
          }
        }
        if (reached || buffer.length > MAX_LINE_CHARS) break;
      }
    } catch {
      // Past events are a nicety: the live stream goes on without them.
    } finally {
      clearTimeout(timer);
      controller.abort();
    }
    this.h.onBackfill(events.slice(-BACKFILL));
  }
}
