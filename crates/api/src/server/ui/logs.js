// The live tail of a task's log: `GET /v1/client/fs/logs/<alloc>?task=T&type=stdout|stderr
// &follow=true&origin=end&offset=N` streams the log's raw bytes from N bytes before its end,
// then what the task writes. The text goes into a <pre> as text; the tail keeps the last
// MAX_CHARS characters.

import { apiFetch, apiPath, errorOf } from './api.js';
import { el } from './dom.js';

/** How far back from the log's end the tail starts, in bytes. */
const START_BYTES = 16 * 1024;
/** Characters the tail keeps on screen. */
const MAX_CHARS = 64 * 1024;

export class LogTail {
  /** A panel for alloc `allocId`; `tasks` are its task names. */
  constructor(allocId, tasks) {
    this.allocId = allocId;
    this.controller = null;
    this.taskSelect = el(
      'select',
      { id: 'log-task', on: { change: () => this.follow() } },
      tasks.map((t) => el('option', { value: t }, t)),
    );
    this.typeSelect = el(
      'select',
      { id: 'log-type', on: { change: () => this.follow() } },
      el('option', { value: 'stdout' }, 'stdout'),
      el('option', { value: 'stderr' }, 'stderr'),
    );
    this.status = el('span', { id: 'log-status', dataset: { state: 'idle' } }, '');
    this.output = el('pre', { id: 'log-output', class: 'log' });
    this.node = el(
      'section',
      { id: 'log-panel' },
      el('h3', {}, 'Log'),
      el('div', { class: 'controls' }, this.taskSelect, this.typeSelect, this.status),
      this.output,
    );
  }

  /** Adds tasks the alloc gained since the panel was made. */
  setTasks(tasks) {
    const have = new Set([...this.taskSelect.options].map((o) => o.value));
    for (const t of tasks) if (!have.has(t)) this.taskSelect.append(el('option', { value: t }, t));
    if (!this.controller && tasks.length > 0) this.follow();
  }

  /** (Re)starts the tail of the selected task and stream. */
  follow() {
    this.stop();
    const task = this.taskSelect.value;
    if (!task) return;
    const controller = new AbortController();
    this.controller = controller;
    this.output.textContent = '';
    this.setStatus('connecting', 'connecting…');
    this.stream(task, this.typeSelect.value, controller).catch((e) => {
      if (controller.signal.aborted) return;
      this.setStatus('error', 'log stream failed: ' + (e && e.message ? e.message : String(e)));
    });
  }

  async stream(task, type, controller) {
    const q = new URLSearchParams({ task, type, follow: 'true', origin: 'end', offset: String(START_BYTES) });
    const resp = await apiFetch(apiPath('client', 'fs', 'logs', this.allocId) + '?' + q, {
      signal: controller.signal,
    });
    if (resp.status === 404) {
      this.setStatus('unavailable', 'logs unavailable');
      return;
    }
    if (resp.status === 401 || resp.status === 403) {
      this.setStatus('refused', 'logs need a token the agent accepts');
      return;
    }
    if (!resp.ok) {
      const e = await errorOf(resp);
      this.setStatus('error', 'logs: ' + e.message);
      return;
    }
    this.setStatus('live', 'following');
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      this.add(decoder.decode(value, { stream: true }));
    }
    this.add(decoder.decode());
    this.setStatus('ended', 'log ended');
  }

  add(text) {
    if (!text) return;
    const atBottom = this.output.scrollTop + this.output.clientHeight >= this.output.scrollHeight - 4;
    let all = this.output.textContent + text;
    if (all.length > MAX_CHARS) all = all.slice(all.length - MAX_CHARS);
    this.output.textContent = all;
    if (atBottom) this.output.scrollTop = this.output.scrollHeight;
  }

  setStatus(state, words) {
    this.status.dataset.state = state;
    this.status.textContent = words;
  }

  stop() {
    if (this.controller) this.controller.abort();
    this.controller = null;
  }
}
