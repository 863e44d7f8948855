// The page: hash routing between views, a refresh of the current view after each burst of
// events from the agent's event stream (no reload), the token box, and the banners.

import { ApiError, getToken, onAuth, sentRequests, setToken } from './api.js';
import { el } from './dom.js';
import { EventFeed } from './feed.js';
import { viewFor } from './views.js';

/** Events that arrive within this many ms are answered by one refresh. */
const DEBOUNCE_MS = 30;
/** A refresh starts at the latest this long after the first event of a burst. */
const MAX_WAIT_MS = 250;
/** Events kept for the overview's "recent events". */
const RECENT = 50;
/** Without an event stream, the view is refreshed this often. */
const POLL_MS = 10000;

// What tests read: the id of this page load (a reload makes a new one), the headers of recent
// requests (names only), events with the time they arrived, and each refresh's end.
const probe = {
  loadId: `${Date.now()}-${Math.random().toString(36).slice(2)}`,
  requests: sentRequests,
  events: [],
  renders: [],
};
window.__berth = probe;

const now = () => performance.timeOrigin + performance.now();

const state = {
  view: null,
  body: null,
  controller: null,
  running: false,
  again: false,
  timer: null,
  firstPending: 0,
  recent: [],
  renders: 0,
  pendingEvents: [],
  poll: null,
};

const viewRoot = document.getElementById('view');

// ------------------------------------------------------------------------------------ banners

const authBanner = document.getElementById('auth-banner');
const errorBanner = document.getElementById('error-banner');

onAuth((status, hadToken) => {
  if (status === 0) {
    if (!authBanner.hidden) {
      authBanner.hidden = true;
      authBanner.dataset.reason = '';
    }
    return;
  }
  authBanner.hidden = false;
  authBanner.dataset.reason = hadToken ? 'refused' : 'needed';
  authBanner.textContent = hadToken
    ? `The agent refused the token (HTTP ${status}): check it in the token box.`
    : `The agent needs an ACL token (HTTP ${status}): enter it in the token box.`;
});

function showError(words) {
  errorBanner.hidden = !words;
  errorBanner.textContent = words || '';
}

// -------------------------------------------------------------------------------- token box

const tokenForm = document.getElementById('token-form');
const tokenInput = document.getElementById('token-input');
const tokenState = document.getElementById('token-state');

function showTokenState() {
  const set = getToken() !== '';
  tokenState.dataset.set = String(set);
  tokenState.textContent = set ? 'token set' : 'no token';
}

tokenForm.addEventListener('submit', (ev) => {
  ev.preventDefault();
  setToken(tokenInput.value.trim());
  tokenInput.value = '';
  showTokenState();
  feed.restart();
  refreshSoon(true);
});

document.getElementById('token-clear').addEventListener('click', () => {
  setToken('');
  tokenInput.value = '';
  showTokenState();
  feed.restart();
  refreshSoon(true);
});

// ------------------------------------------------------------------------------------ routing

function route() {
  if (state.view && state.view.dispose) state.view.dispose();
  if (state.controller) state.controller.abort();
  const view = viewFor(location.hash || '#/');
  state.view = view;
  state.body = el('div', { id: 'view-body' }, el('p', { class: 'muted' }, 'Loading…'));
  viewRoot.dataset.view = view.name;
  viewRoot.dataset.renders = '0';
  state.renders = 0;
  viewRoot.replaceChildren(state.body, ...(view.extra ? [view.extra] : []));
  for (const a of document.querySelectorAll('#nav a')) {
    a.classList.toggle('current', a.dataset.nav === view.nav);
  }
  refreshSoon(true);
}

window.addEventListener('hashchange', route);

// ------------------------------------------------------------------------------------ refresh

/** Refreshes the current view: now, or after the current burst of events. */
function refreshSoon(immediately = false) {
  clearTimeout(state.timer);
  if (immediately) {
    state.firstPending = 0;
    refresh();
    return;
  }
  const t = now();
  if (!state.firstPending) state.firstPending = t;
  const wait = Math.max(0, Math.min(DEBOUNCE_MS, state.firstPending + MAX_WAIT_MS - t));
  state.timer = setTimeout(() => {
    state.firstPending = 0;
    refresh();
  }, wait);
}

/** Loads and renders the current view; one at a time (a refresh asked for meanwhile runs
 *  after it). */
async function refresh() {
  if (state.running) {
    state.again = true;
    return;
  }
  state.running = true;
  const view = state.view;
  const body = state.body;
  const events = state.pendingEvents;
  state.pendingEvents = [];
  const controller = new AbortController();
  state.controller = controller;
  try {
    const data = await view.load(controller.signal);
    if (view !== state.view) return;
    body.replaceChildren(view.render(data, { recent: state.recent }));
    showError('');
    state.renders += 1;
    viewRoot.dataset.renders = String(state.renders);
    const rendered = now();
    probe.renders.push({
      view: view.name,
      at: rendered,
      events: events.map((e) => e.Index),
    });
    if (probe.renders.length > 200) probe.renders.splice(0, probe.renders.length - 200);
  } catch (e) {
    if (view !== state.view || controller.signal.aborted) return;
    body.replaceChildren(errorNode(e));
  } finally {
    state.running = false;
    if (state.again) {
      state.again = false;
      refresh();
    }
  }
}

function errorNode(e) {
  if (e instanceof ApiError) {
    if (e.isAuth) {
      const words = getToken()
        ? 'The agent refused the token: check it in the token box.'
        : 'A token is needed: enter it in the token box.';
      return el('p', { class: 'banner warn', id: 'view-error', dataset: { status: e.status } }, words);
    }
    if (e.status === 404) return el('p', { id: 'view-error', class: 'muted', dataset: { status: 404 } }, 'Not found: ' + e.message);
    if (e.status === 0) {
      showError('The agent does not answer; retrying when it is back.');
    }
    return el('p', { id: 'view-error', class: 'banner error', dataset: { status: e.status } }, e.message);
  }
  return el('p', { id: 'view-error', class: 'banner error' }, String(e && e.message ? e.message : e));
}

// ------------------------------------------------------------------------------ event stream

const feedState = document.getElementById('feed-state');

function remember(events) {
  state.recent.push(...events);
  if (state.recent.length > RECENT) state.recent.splice(0, state.recent.length - RECENT);
}

const feed = new EventFeed({
  onEvents(events) {
    const arrived = now();
    for (const e of events) {
      probe.events.push({ Index: e.Index, Topic: e.Topic, Type: e.Type, Key: e.Key, TimeMs: e.TimeMs, arrived });
    }
    if (probe.events.length > 500) probe.events.splice(0, probe.events.length - 500);
    remember(events);
    state.pendingEvents.push(...events);
    refreshSoon();
  },
  onMissed() {
    refreshSoon();
  },
  onConnected() {
    // Whatever happened while disconnected (or before the first connection) is in the
    // current state: read it again.
    if (state.poll) {
      clearInterval(state.poll);
      state.poll = null;
    }
    refreshSoon();
  },
  onBackfill(events) {
    const seen = new Set(state.recent.map((e) => e.Index));
    state.recent = events.filter((e) => !seen.has(e.Index)).concat(state.recent).slice(-RECENT);
    if (state.view && state.view.name === 'overview') refreshSoon();
  },
  onState(s, detail) {
    feedState.dataset.state = s;
    feedState.textContent = s === 'live' ? 'live' : s === 'unavailable' ? 'no live updates' : s;
    feedState.title = detail || 'live updates from the agent\'s event stream';
    if (s === 'unavailable' && !state.poll) state.poll = setInterval(() => refreshSoon(), POLL_MS);
  },
});

showTokenState();
route();
feed.start();
