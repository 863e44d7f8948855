// The views of the page. Each is `{ name, load(signal) → data, render(data, ctx) → Node }`,
// plus `extra` (a node kept across refreshes) and `dispose()` where it needs them. A view
// shows only what the API answered; every value goes in as text (see dom.js).

import { apiPath, getJSON } from './api.js';
import { badge, bytes, el, facts, link, pairs, row, systemTimeMs, table, when } from './dom.js';
import { LogTail } from './logs.js';

/** The view for a hash route (`#/`, `#/jobs`, `#/job/<id>`…). */
export function viewFor(hash) {
  const parts = hash.replace(/^#\/?/, '').split('/').filter((p) => p !== '');
  let decoded;
  try {
    decoded = parts.map((p) => decodeURIComponent(p));
  } catch {
    return notFoundView('that address is not valid');
  }
  const [top, id, ...rest] = decoded;
  if (rest.length > 0) return notFoundView('no such view');
  switch (top) {
    case undefined:
      return overviewView();
    case 'jobs':
      return id === undefined ? jobsView() : notFoundView('no such view');
    case 'job':
      return id !== undefined ? jobView(id) : jobsView();
    case 'alloc':
      return id !== undefined ? allocView(id) : notFoundView('which alloc?');
    case 'volumes':
      return id === undefined ? volumesView() : notFoundView('no such view');
    case 'volume':
      return id !== undefined ? volumeView(id) : volumesView();
    case 'plugins':
      return pluginsView();
    case 'nodes':
      return nodesView();
    default:
      return notFoundView('no such view');
  }
}

function notFoundView(words) {
  return {
    name: 'missing',
    nav: '',
    load: async () => null,
    render: () => el('p', { class: 'muted', id: 'missing' }, words),
  };
}

function heading(text, ...rest) {
  return el('h2', {}, text, rest);
}

// ---------------------------------------------------------------------------------- overview

function overviewView() {
  return {
    name: 'overview',
    nav: 'overview',
    async load(signal) {
      const [jobs, volumes, plugins, node, nodes] = await Promise.all([
        getJSON('/v1/jobs', signal),
        getJSON('/v1/volumes', signal),
        getJSON('/v1/plugins', signal),
        getJSON('/v1/node', signal),
        getJSON('/v1/nodes', signal),
      ]);
      return { jobs: jobs.jobs, volumes: volumes.volumes, plugins: plugins.plugins, node, nodes };
    },
    render(d, ctx) {
      const allocs = { running: 0, pending: 0, complete: 0, failed: 0 };
      for (const j of d.jobs) {
        for (const [status, n] of Object.entries(j.allocs || {})) allocs[status] = (allocs[status] || 0) + n;
      }
      const healthy = d.plugins.filter((p) => p.health && p.health.healthy).length;
      const count = (key, label, n, href) =>
        el('a', { class: 'count', href, dataset: { count: key } }, el('span', { class: 'n' }, String(n)), el('span', {}, label));
      return el(
        'div',
        {},
        heading('Overview'),
        el(
          'div',
          { id: 'overview-counts', class: 'counts' },
          count('jobs', 'jobs', d.jobs.length, '#/jobs'),
          count('allocs-running', 'allocs running', allocs.running, '#/jobs'),
          count('allocs-pending', 'allocs pending', allocs.pending, '#/jobs'),
          count('allocs-failed', 'allocs failed', allocs.failed, '#/jobs'),
          count('volumes', 'volumes', d.volumes.length, '#/volumes'),
          count('plugins', 'CSI plugins', d.plugins.length, '#/plugins'),
          count('plugins-healthy', 'healthy plugins', healthy, '#/plugins'),
          count('nodes', d.nodes.fleet ? 'fleet nodes' : 'node', d.nodes.nodes.length, '#/nodes'),
        ),
        el('h3', {}, 'This node'),
        facts('overview-node', [
          ['name', d.node.name],
          ['id', d.node.id],
          ['hostname', d.node.hostname],
          ['datacenter', d.node.datacenter],
          ['region', d.node.region],
          ['class', d.node.node_class],
        ]),
        el('h3', {}, 'Recent events'),
        recentEvents(ctx.recent),
      );
    },
  };
}

function recentEvents(events) {
  if (events.length === 0) return el('p', { id: 'recent-events', class: 'muted' }, 'No events yet.');
  return el(
    'ol',
    { id: 'recent-events', class: 'events', reversed: true },
    events
      .slice()
      .reverse()
      .map((e) =>
        el(
          'li',
          { dataset: { eventIndex: e.Index, topic: e.Topic, type: e.Type } },
          el('span', { class: 'time' }, when(e.TimeMs)),
          ' ',
          el('span', { class: 'topic' }, String(e.Topic)),
          ' ',
          el('strong', {}, String(e.Type)),
          ' ',
          eventKeyLink(e),
          eventWords(e),
        ),
      ),
  );
}

function eventKeyLink(e) {
  const key = String(e.Key || '');
  switch (e.Topic) {
    case 'Job':
      return link(['job', key], key);
    case 'Allocation':
      return e.Type === 'AllocationDeleted' ? key : link(['alloc', key], key);
    case 'CSIVolume':
      return link(['volume', key], key);
    default:
      return key;
  }
}

function eventWords(e) {
  const p = e.Payload || {};
  const words = typeof p.Message === 'string' ? p.Message : typeof p.Reason === 'string' ? p.Reason : '';
  return words ? el('span', { class: 'muted' }, ' — ' + words) : null;
}

// -------------------------------------------------------------------------------------- jobs

function allocCounts(counts) {
  const entries = Object.entries(counts || {}).filter(([, n]) => n > 0);
  if (entries.length === 0) return '—';
  return entries.map(([s, n]) => `${s} ${n}`).join(', ');
}

function jobsView() {
  return {
    name: 'jobs',
    nav: 'jobs',
    load: (signal) => getJSON('/v1/jobs', signal),
    render(d) {
      const rows = d.jobs.map((j) =>
        row({ dataset: { jobId: j.id, stopped: j.stopped } }, [
          link(['job', j.id], j.id),
          j.job_type,
          j.stopped ? badge('stopped', 'stop') : badge('running'),
          allocCounts(j.allocs),
        ]),
      );
      return el('div', {}, heading('Jobs'), table('jobs-table', ['Job', 'Type', 'Status', 'Allocs'], rows, 'No jobs.'));
    },
  };
}

function jobView(id) {
  return {
    name: 'job',
    nav: 'jobs',
    load: (signal) => getJSON(apiPath('job', id), signal),
    render(j) {
      const placements = new Map((j.placements || []).map((p) => [p.alloc_id, p]));
      const rows = j.allocs.map((a) =>
        row({ dataset: { allocId: a.alloc_id, status: a.client_status, desired: a.desired } }, [
          link(['alloc', a.alloc_id], a.alloc_id),
          `${a.group}[${a.index}]`,
          badge(a.desired, a.desired === 'stop' ? 'stop' : 'plain'),
          badge(a.client_status),
          Object.entries(a.tasks || {}).map(([name, t]) => el('span', { class: 'task' }, `${name}: `, badge(t.state))),
          placements.has(a.alloc_id) ? placements.get(a.alloc_id).node_name : '',
          a.failure || '',
        ]),
      );
      return el(
        'div',
        {},
        heading('Job ', el('span', { id: 'job-title', class: 'id' }, j.id)),
        facts('job-facts', [
          ['type', j.job_type],
          ['status', j.stopped ? 'stopped' : 'running'],
          ['version', j.version === undefined ? '' : String(j.version)],
        ]),
        el('h3', {}, 'Allocs'),
        table('job-allocs', ['Alloc', 'Group', 'Desired', 'Status', 'Tasks', 'Node', 'Failure'], rows, 'No allocs.'),
        (j.failures || []).length
          ? [el('h3', {}, 'Placement failures'), el('ul', { id: 'job-failures' }, j.failures.map((f) => el('li', {}, f)))]
          : null,
      );
    },
  };
}

// ------------------------------------------------------------------------------------ allocs

function exitWords(x) {
  if (!x) return '—';
  const words = [];
  if (x.exit_code !== null && x.exit_code !== undefined) words.push(`exit ${x.exit_code}`);
  if (x.signal !== null && x.signal !== undefined) words.push(`signal ${x.signal}`);
  if (x.oom_killed) words.push('OOM killed');
  return words.length ? words.join(', ') : 'unknown';
}

function allocView(id) {
  let tail = null;
  const extra = el('div', { id: 'alloc-extra' });
  return {
    name: 'alloc',
    nav: 'jobs',
    extra,
    load: (signal) => getJSON(apiPath('alloc', id), signal),
    render(a) {
      const tasks = Object.keys(a.tasks || {});
      if (!tail) {
        tail = new LogTail(a.alloc_id, tasks);
        extra.append(tail.node);
      }
      tail.setTasks(tasks);
      const taskRows = Object.entries(a.tasks || {}).map(([name, t]) =>
        row({ dataset: { task: name, state: t.state } }, [
          name,
          t.driver,
          badge(t.state),
          t.pid === null || t.pid === undefined ? '—' : String(t.pid),
          String(t.restarts),
          [t.failed ? badge('failed') : null, t.lost ? badge('lost') : null],
          exitWords(t.last_exit),
          when(systemTimeMs(t.started_at)),
          when(systemTimeMs(t.finished_at)),
          (t.devices || []).map((d) => el('div', {}, `${d.request}: ${d.devices.join(', ')}`)),
        ]),
      );
      const volumeRows = Object.entries(a.volumes || {}).map(([name, v]) =>
        row({ dataset: { volume: name, volumeId: v.volume_id, claimed: v.claimed } }, [
          name,
          link(['volume', v.volume_id], v.volume_id),
          v.access_mode,
          v.attachment_mode,
          v.read_only ? 'read' : 'write',
          v.fs_type || 'default',
          v.mount_flags ? 'set (not shown)' : 'none',
          v.claimed ? badge('claimed') : badge('not claimed', 'plain'),
          v.target ? el('code', {}, v.target) : '—',
        ]),
      );
      const events = (a.events || []).map((e) =>
        el(
          'li',
          { dataset: { kind: e.kind } },
          el('span', { class: 'time' }, when(systemTimeMs(e.time))),
          ' ',
          e.task ? el('span', { class: 'task' }, e.task) : el('span', { class: 'muted' }, 'alloc'),
          ' ',
          el('strong', {}, String(e.kind)),
          ' ',
          e.message,
        ),
      );
      return el(
        'div',
        {},
        heading('Alloc ', el('span', { id: 'alloc-title', class: 'id' }, a.alloc_id)),
        el(
          'p',
          { id: 'alloc-status', dataset: { status: a.client_status, desired: a.desired } },
          'Status ',
          badge(a.client_status),
          ' desired ',
          badge(a.desired, a.desired === 'stop' ? 'stop' : 'plain'),
        ),
        facts('alloc-facts', [
          ['job', link(['job', a.job_id], a.job_id)],
          ['group', `${a.group}[${a.index}]`],
          ['failure', a.failure || ''],
        ]),
        el('h3', {}, 'Tasks'),
        table(
          'alloc-tasks',
          ['Task', 'Driver', 'State', 'Pid', 'Restarts', '', 'Last exit', 'Started', 'Finished', 'Devices'],
          taskRows,
          'No tasks.',
        ),
        el('h3', {}, 'Volumes'),
        table(
          'alloc-volumes',
          ['Name', 'Volume', 'Access', 'Attachment', 'Mode', 'Fs type', 'Mount flags', 'Claim', 'Target'],
          volumeRows,
          'No volumes.',
        ),
        el('h3', {}, 'Events', a.events_dropped ? el('span', { class: 'muted' }, ` (${a.events_dropped} older dropped)`) : null),
        events.length ? el('ol', { id: 'alloc-events', class: 'events' }, events) : el('p', { id: 'alloc-events', class: 'muted' }, 'No events.'),
      );
    },
    dispose() {
      if (tail) tail.stop();
    },
  };
}

// ----------------------------------------------------------------------------------- volumes

function volumesView() {
  return {
    name: 'volumes',
    nav: 'volumes',
    load: (signal) => getJSON('/v1/volumes', signal),
    render(d) {
      const rows = d.volumes.map((v) =>
        row({ dataset: { volumeId: v.id, claims: v.read_claims + v.write_claims } }, [
          link(['volume', v.id], v.id),
          el('span', { class: 'volume-name' }, v.name),
          link(['plugins'], v.plugin_id),
          v.external_id,
          (v.access_modes || []).join(', '),
          `${v.read_claims} read, ${v.write_claims} write`,
          bytes(v.capacity_bytes),
        ]),
      );
      return el(
        'div',
        {},
        heading('Volumes'),
        table('volumes-table', ['Volume', 'Name', 'Plugin', 'External id', 'Access modes', 'Claims', 'Capacity'], rows, 'No volumes.'),
      );
    },
  };
}

function volumeView(id) {
  return {
    name: 'volume',
    nav: 'volumes',
    load: (signal) => getJSON(apiPath('volume', 'csi', id), signal),
    render(v) {
      const claims = v.claims.map((c) =>
        row({ dataset: { claimAlloc: c.alloc_id, state: c.state } }, [
          link(['alloc', c.alloc_id], c.alloc_id),
          c.node_id,
          c.mode,
          c.access_mode,
          c.attachment_mode,
          badge(c.state),
          c.error || '',
        ]),
      );
      const usages = v.usages.map((u) =>
        row({ dataset: { usage: u.usage } }, [
          u.usage,
          u.mount_options.fs_type || 'default',
          u.mount_options.mount_flags ? 'set (not shown)' : 'none',
          u.staging ? badge(u.staging) : '—',
          el(
            'ul',
            { class: 'plain' },
            u.allocs.map((p) =>
              el(
                'li',
                { dataset: { publishedAlloc: p.alloc_id, state: p.state } },
                link(['alloc', p.alloc_id], p.alloc_id),
                ' ',
                badge(p.state),
                ' ',
                el('code', {}, p.target),
                p.stats ? el('span', { class: 'muted' }, ' ' + statsWords(p.stats)) : null,
              ),
            ),
          ),
        ]),
      );
      return el(
        'div',
        {},
        heading('Volume ', el('span', { id: 'volume-title', class: 'id' }, v.id)),
        facts('volume-facts', [
          ['name', el('span', { class: 'volume-name' }, v.name)],
          ['plugin', v.plugin_id],
          ['external id', v.external_id],
          ['origin', v.origin],
          ['capacity', bytes(v.capacity_bytes)],
          ['capabilities', v.capabilities.map((c) => `${c.access_mode} (${c.attachment_mode})`).join(', ')],
          ['fs type', v.mount_options.fs_type || 'default'],
          ['mount flags', v.mount_options.mount_flags ? 'set (not shown)' : 'none'],
          ['secrets', v.secret_names.length ? v.secret_names.join(', ') + ' (values not shown)' : 'none'],
          ['parameters', pairs(v.parameters).join(', ')],
          ['context', pairs(v.context).join(', ')],
          ['topology', v.topology.map((t) => pairs(t).join(',')).join(' | ')],
          ['controller publish', v.controller_required ? 'required' : 'not required'],
          ['created', when(v.created_ms)],
        ]),
        el('h3', {}, 'Claims'),
        table('volume-claims', ['Alloc', 'Node', 'Mode', 'Access', 'Attachment', 'State', 'Error'], claims, 'No claims.'),
        el('h3', {}, 'On this node'),
        table('volume-usages', ['Usage', 'Fs type', 'Mount flags', 'Staging', 'Published for'], usages, 'Not staged or published here.'),
      );
    },
  };
}

function statsWords(s) {
  try {
    return JSON.stringify(s);
  } catch {
    return '';
  }
}

// ----------------------------------------------------------------------------------- plugins

function pluginsView() {
  return {
    name: 'plugins',
    nav: 'plugins',
    load: (signal) => getJSON('/v1/plugins', signal),
    render(d) {
      const cards = d.plugins.map((p) => {
        const fp = p.fingerprint;
        return el(
          'section',
          { class: 'card plugin', dataset: { pluginId: p.id, healthy: p.health.healthy } },
          el('h3', {}, el('span', { class: 'id' }, p.id), ' ', badge(p.health.healthy ? 'healthy' : 'unhealthy')),
          facts(null, [
            ['type', p.type],
            ['health', p.health.description],
            ['since', when(p.health.last_transition_ms)],
            ['provider', fp ? `${fp.provider} ${fp.version}` : 'not fingerprinted yet'],
          ]),
          table(
            null,
            ['Instance', 'Source', 'Socket', 'Active', 'Health', 'Registered'],
            p.instances.map((i) =>
              row({ dataset: { instance: i.instance, healthy: i.health.healthy } }, [
                i.instance,
                i.source,
                el('code', {}, i.socket),
                i.active ? 'active' : '',
                [badge(i.health.healthy ? 'healthy' : 'unhealthy'), ' ', i.health.description],
                when(i.registered_ms),
              ]),
            ),
            'No instances.',
          ),
        );
      });
      return el(
        'div',
        {},
        heading('CSI plugins'),
        el('div', { id: 'plugins-list' }, cards.length ? cards : el('p', { class: 'muted' }, 'No plugins.')),
      );
    },
  };
}

// ------------------------------------------------------------------------------------- nodes

function nodesView() {
  return {
    name: 'nodes',
    nav: 'nodes',
    async load(signal) {
      const [list, self] = await Promise.all([getJSON('/v1/nodes', signal), getJSON('/v1/node', signal)]);
      return { list, self };
    },
    render({ list, self }) {
      const cards = list.nodes.map((n) => nodeCard(n, n.id === self.id ? self : null));
      return el(
        'div',
        {},
        heading(list.fleet ? 'Fleet nodes' : 'Node'),
        el('div', { id: 'nodes-list' }, cards.length ? cards : el('p', { class: 'muted' }, 'No nodes.')),
      );
    },
  };
}

function nodeCard(n, self) {
  const drivers = (n.drivers || []).map((d) =>
    el('li', { dataset: { driver: d.name, healthy: d.healthy } }, el('strong', {}, d.name), ' ', badge(d.healthy ? 'healthy' : 'unhealthy'), d.description ? ' ' + d.description : ''),
  );
  const devices = (n.devices || []).map((d) => el('li', { dataset: { device: d.id } }, `${d.id}: ${d.healthy} of ${d.total} healthy`));
  return el(
    'section',
    { class: 'card node', dataset: { nodeId: n.id, status: n.status } },
    el('h3', {}, el('span', { class: 'id' }, n.name || n.id), ' ', badge(n.status), n.drain ? [' ', badge('draining')] : null),
    facts(null, [
      ['id', n.id],
      ['hostname', n.hostname],
      ['datacenter', n.datacenter],
      ['region', n.region],
      ['class', n.node_class],
      ['computed class', n.computed_class],
      ['cpu', n.resources && n.resources.cpu_mhz ? `${n.resources.cpu_mhz} MHz` : ''],
      ['memory', n.resources && n.resources.memory_mb ? `${n.resources.memory_mb} MB` : ''],
      ['registered', n.registered_ms ? when(n.registered_ms) : ''],
      ['meta', pairs(n.meta).join(', ')],
    ]),
    el('h4', {}, 'Drivers'),
    drivers.length ? el('ul', { class: 'plain drivers' }, drivers) : el('p', { class: 'muted' }, 'No drivers.'),
    el('h4', {}, 'Devices'),
    devices.length ? el('ul', { class: 'plain devices' }, devices) : el('p', { class: 'muted' }, 'No devices.'),
    self ? deviceDetail(self.devices) : null,
    el('h4', {}, 'CSI node plugins'),
    (n.csi_plugins || []).length
      ? el(
          'ul',
          { class: 'plain' },
          n.csi_plugins.map((p) =>
            el('li', { dataset: { csiPlugin: p.plugin_id } }, el('strong', {}, p.plugin_id), ' ', badge(p.healthy ? 'healthy' : 'unhealthy'), p.csi_node_id ? ` node id ${p.csi_node_id}` : ''),
          ),
        )
      : el('p', { class: 'muted' }, 'None.'),
    el('details', {}, el('summary', {}, 'Attributes'), el('ul', { class: 'plain attrs' }, pairs(n.attributes).map((a) => el('li', {}, el('code', {}, a))))),
  );
}

function deviceDetail(devices) {
  if (!devices || ((devices.plugins || []).length === 0 && (devices.groups || []).length === 0)) return null;
  const pluginName = (id) => (id && typeof id === 'object' ? `${id.protocol}:${id.name}` : String(id));
  return el(
    'div',
    { class: 'device-detail' },
    el(
      'ul',
      { class: 'plain' },
      (devices.plugins || []).map((p) =>
        el('li', { dataset: { devicePlugin: pluginName(p.id) } }, 'plugin ', el('strong', {}, pluginName(p.id)), ' ', badge(p.state), p.reason ? ' ' + p.reason : ''),
      ),
    ),
    (devices.groups || []).map((g) =>
      el(
        'div',
        { class: 'device-group' },
        el('strong', {}, `${g.vendor}/${g.device_type}/${g.name}`),
        el(
          'ul',
          { class: 'plain' },
          g.instances.map((i) =>
            el(
              'li',
              { dataset: { deviceInstance: i.id, healthy: i.healthy } },
              i.id,
              ' ',
              badge(i.healthy ? 'healthy' : 'unhealthy'),
              i.reserved_by ? [' held by ', link(['alloc', i.reserved_by], i.reserved_by)] : null,
              i.health_description ? ' ' + i.health_description : '',
            ),
          ),
        ),
      ),
    ),
  );
}
