// vgpu-bridge dashboard: reads the operator API (/v1) with the token typed
// into the page and renders it. Read-only: it only ever sends GETs.
// No framework, no build step; DOM built with createElement (never
// innerHTML), so API strings cannot inject markup.
'use strict';

(function () {
  const REFRESH_MS = 5000;
  const REQUEST_LIMIT = 25;
  const TOKEN_KEY = 'vgpu-bridge.dashboard.token';
  const FINAL = new Set(['succeeded', 'failed', 'rejected']);

  const $ = (id) => document.getElementById(id);

  // --- token (sessionStorage: gone when the tab closes) ---------------
  function loadToken() {
    try { return sessionStorage.getItem(TOKEN_KEY) || ''; } catch (e) { return ''; }
  }
  function saveToken(t) {
    try {
      if (t) sessionStorage.setItem(TOKEN_KEY, t); else sessionStorage.removeItem(TOKEN_KEY);
    } catch (e) { /* storage disabled: the token lives in memory only */ }
  }
  let token = loadToken();

  // --- API --------------------------------------------------------------
  class APIError extends Error {
    constructor(path, status, problem) {
      const p = problem || {};
      super(p.detail || p.title || ('HTTP ' + status));
      this.path = path;
      this.status = status;
      this.title = p.title || '';
      this.code = p.code || '';
      this.requestID = p.request_id || '';
    }
  }

  async function api(path) {
    const headers = { Accept: 'application/json' };
    if (token) headers['X-Auth-Token'] = token;
    let resp;
    try {
      resp = await fetch(path, { headers, cache: 'no-store', credentials: 'omit' });
    } catch (e) {
      throw new APIError(path, 0, { title: 'Unreachable', detail: 'cannot reach the bridge (' + e.message + ')' });
    }
    let body = null;
    const ct = resp.headers.get('Content-Type') || '';
    if (ct.includes('json')) {
      try { body = await resp.json(); } catch (e) { body = null; }
    }
    if (!resp.ok) throw new APIError(path, resp.status, body);
    if (body === null) throw new APIError(path, resp.status, { title: 'Bad answer', detail: 'the answer is not JSON' });
    return body;
  }

  // --- DOM helpers ------------------------------------------------------
  function h(tag, props, ...kids) {
    const el = document.createElement(tag);
    if (props) {
      for (const [k, v] of Object.entries(props)) {
        if (v === null || v === undefined || v === false) continue;
        if (k === 'class') el.className = v;
        else if (k === 'dataset') Object.assign(el.dataset, v);
        else if (k === 'style') Object.assign(el.style, v); // CSSOM, allowed by the CSP
        else el.setAttribute(k, v === true ? '' : String(v));
      }
    }
    for (const kid of kids.flat(Infinity)) {
      if (kid === null || kid === undefined || kid === false) continue;
      el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
    return el;
  }
  const badge = (cls, text, title) => h('span', { class: 'badge ' + cls, title: title || null }, text);
  const muted = (text) => h('p', { class: 'muted' }, text);

  function bar(used, cap, label) {
    const pct = cap > 0 ? Math.min(100, Math.round((used / cap) * 100)) : 0;
    const cls = 'bar' + (cap > 0 && used >= cap ? ' full' : '') + (cap === 0 ? ' reserved' : '');
    return h('div', { class: cls, role: 'img', 'aria-label': label || (used + ' of ' + cap + ' used') },
      h('span', { style: { width: pct + '%' } }));
  }

  // --- time -------------------------------------------------------------
  // Ages are measured against the server's clock (status.time) when known.
  let clockOffset = 0;
  const nowMs = () => Date.now() + clockOffset;

  function duration(sec) {
    if (sec === null || sec === undefined || isNaN(sec)) return '–';
    if (sec < 1) return Math.round(sec * 1000) + ' ms';
    if (sec < 10) return sec.toFixed(1) + ' s';
    if (sec < 90) return Math.round(sec) + ' s';
    if (sec < 5400) return Math.round(sec / 60) + ' min';
    if (sec < 172800) return Math.round(sec / 3600) + ' h';
    return Math.round(sec / 86400) + ' d';
  }
  function ageOf(iso) {
    if (!iso) return null;
    const t = Date.parse(iso);
    return isNaN(t) ? null : Math.max(0, (nowMs() - t) / 1000);
  }
  function ago(iso) {
    const s = ageOf(iso);
    if (s === null) return '–';
    return s < 1 ? 'just now' : duration(s) + ' ago';
  }
  const timeEl = (iso) => iso ? h('time', { datetime: iso, title: new Date(iso).toLocaleString() }, ago(iso)) : '–';
  const clock = (d) => d.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit', hour12: false });

  // --- state --------------------------------------------------------------
  const last = { hosts: null, gpus: null, requests: null, status: null, drift: null };
  let paused = false;
  let timer = null;
  let inflight = false;
  let again = false;
  let refreshes = 0;

  function settle(p) {
    return p.then((v) => ({ ok: true, value: v }), (e) => ({ ok: false, error: e }));
  }

  async function refresh() {
    if (inflight) { again = true; return; }
    inflight = true;
    const sent = token;
    try {
      const [hosts, gpus, requests, status, drift] = await Promise.all([
        settle(api('/v1/hosts')),
        settle(api('/v1/gpus')),
        settle(api('/v1/requests?limit=' + REQUEST_LIMIT)),
        settle(api('/v1/status')),
        settle(api('/v1/drift')),
      ]);
      // Signed in or out meanwhile: these answers are for the old token,
      // and a refresh with the new one follows (again).
      if (sent !== token) return;
      Object.assign(last, { hosts, gpus, requests, status, drift });
      if (status.ok && status.value.time) {
        const t = Date.parse(status.value.time);
        if (!isNaN(t)) clockOffset = t - Date.now();
      }
      const results = [hosts, gpus, requests, status];
      const auth = results.map((r) => r.error).find((e) => e && (e.status === 401 || e.status === 403));
      const down = results.map((r) => r.error).find((e) => e && e.status === 0);
      renderAll();
      showProblem(auth, down, results.map((r) => r.error).find((e) => e));
      refreshes++;
      document.body.dataset.refreshes = String(refreshes);
      document.body.dataset.state = auth ? 'auth' : (results.every((r) => r.ok) ? 'ready' : 'error');
      const upd = $('updated');
      upd.classList.toggle('stale', !results.every((r) => r.ok));
      upd.textContent = (auth ? 'Waiting for sign-in · ' : results.every((r) => r.ok) ? 'Updated ' : 'Update incomplete · ') + clock(new Date()) +
        (paused ? ' · paused' : ' · every ' + (REFRESH_MS / 1000) + ' s');
    } finally {
      inflight = false;
      if (again) { again = false; refresh(); }
    }
  }

  function schedule() {
    clearTimeout(timer);
    timer = null;
    if (!paused && !document.hidden) timer = setTimeout(tick, REFRESH_MS);
  }
  async function tick() {
    try { await refresh(); } finally { schedule(); }
  }

  // --- auth and problems -------------------------------------------------
  // needLogin: the API answered 401, so a token is needed (with noauth
  // it never does, and the page works without one).
  let needLogin = false;
  function showSession() {
    $('login').hidden = !!token || !needLogin;
    $('session').hidden = !token && needLogin;
    $('session-text').textContent = token ? 'Signed in' : 'Open API · no token needed';
    $('logout').hidden = !token;
  }

  function showProblem(auth, down, any) {
    if (!auth || auth.status !== 401) showSession();
    const box = $('alert');
    box.className = 'alert';
    if (auth && auth.status === 401) {
      const refused = !!token;
      if (refused) { token = ''; saveToken(''); }
      needLogin = true;
      showSession();
      box.replaceChildren(
        h('strong', null, refused ? 'The API refused the token (401 Unauthorized).' : 'Sign in to read the operator API (401 Unauthorized).'),
        'Enter an API token above: a token of [api] token_file, or a Keystone token with the reader or admin role.',
        auth.message ? h('span', { class: 'alert-detail' }, ' The API said: ' + auth.message + '.') : null);
      box.hidden = false;
      return;
    }
    if (auth && auth.status === 403) {
      box.replaceChildren(
        h('strong', null, 'This token may not read ' + auth.path + ' (403 Forbidden).'),
        (auth.message || '') + ' The dashboard needs the reader or admin role.');
      box.hidden = false;
      return;
    }
    if (down) {
      box.replaceChildren(h('strong', null, 'The bridge cannot be reached.'), down.message + '. Retrying every ' + (REFRESH_MS / 1000) + ' s.');
      box.hidden = false;
      return;
    }
    if (any) {
      box.className = 'alert info';
      box.replaceChildren(h('strong', null, 'Part of the page could not be updated.'),
        any.path + ': ' + any.status + ' ' + (any.title || '') + (any.message ? ' · ' + any.message : '') +
        (any.requestID ? ' (request ' + any.requestID + ')' : ''));
      box.hidden = false;
      return;
    }
    box.hidden = true;
    box.replaceChildren();
  }

  function sectionError(r) {
    const e = r.error;
    if (e.status === 401) return h('p', { class: 'muted' }, 'Sign in to see this.');
    if (e.status === 403) return h('p', { class: 'muted' }, 'The token’s role may not read ' + e.path + ' (403 Forbidden).');
    let text = e.path + ': ' + (e.status ? e.status + ' ' : '') + (e.title || 'error');
    if (e.message && e.message !== e.title) text += ' · ' + e.message;
    return h('p', { class: 'muted' }, text);
  }

  // --- rendering -----------------------------------------------------------
  function statusHosts() {
    const byKey = new Map();
    if (last.status && last.status.ok) {
      for (const s of last.status.value.hosts || []) {
        byKey.set('name:' + s.name, s);
        if (s.node) byKey.set('node:' + s.node, s);
      }
    }
    return byKey;
  }

  function renderAll() {
    renderTiles();
    renderTypes();
    renderFleet();
    renderRequests();
    renderIngest();
    renderDrift();
    if (last.status && last.status.ok && last.status.value.version) {
      $('footer-version').textContent = 'vgpu-bridge ' + last.status.value.version;
    }
  }

  function setTile(id, value, note, noteCls) {
    $(id).textContent = value;
    const n = $(id + '-note');
    n.textContent = note || '';
    n.className = 'tile-note' + (noteCls ? ' ' + noteCls : '');
  }

  function renderTiles() {
    const hosts = last.hosts && last.hosts.ok ? last.hosts.value.hosts : null;
    const gpus = last.gpus && last.gpus.ok ? last.gpus.value.gpus : null;
    const st = last.status && last.status.ok ? last.status.value : null;
    if (hosts) {
      let note = '';
      let cls = '';
      if (st) {
        const sh = statusHosts();
        let reporting = 0, stale = 0;
        for (const x of hosts) {
          const s = sh.get('node:' + x.node) || sh.get('name:' + x.name);
          if (s && s.last_report_at) { if (s.stale) stale++; else reporting++; }
        }
        note = reporting + ' agent' + (reporting === 1 ? '' : 's') + ' reporting' + (stale ? ' · ' + stale + ' stale' : '');
        if (stale) cls = 'warn';
      }
      setTile('t-hosts', hosts.length, note, cls);
    } else setTile('t-hosts', '–');
    if (gpus) {
      let cap = 0, used = 0, free = 0;
      const types = new Set();
      let withFree = 0;
      for (const g of gpus) {
        if (g.mode === 'mixed') continue; // MiB of framebuffer, not vGPUs (shown in the fleet)
        cap += g.capacity; used += g.used; free += g.free;
        types.add(g.profile || g.trait || g.resource_class);
        if (g.free > 0) withFree++;
      }
      setTile('t-gpus', gpus.length, types.size + ' vGPU type' + (types.size === 1 ? '' : 's'));
      const pct = cap ? (used / cap) * 100 : 0;
      setTile('t-used', used + ' / ' + cap, cap ? (used > 0 && pct < 1 ? '< 1' : Math.round(pct)) + ' % of capacity' : 'no capacity');
      setTile('t-free', free, 'on ' + withFree + ' GPU' + (withFree === 1 ? '' : 's'), free === 0 && cap > 0 ? 'bad' : '');
    } else { setTile('t-gpus', '–'); setTile('t-used', '–'); setTile('t-free', '–'); }
    if (last.requests && last.requests.ok) {
      const rs = last.requests.value.requests;
      const open = rs.filter((r) => !FINAL.has(r.state)).length;
      const failed = rs.filter((r) => r.state === 'failed' || r.state === 'rejected').length;
      setTile('t-inflight', open, 'of the ' + rs.length + ' newest · ' + failed + ' failed or rejected', failed ? 'warn' : '');
    } else setTile('t-inflight', '–');
    if (st) {
      const i = st.ingest;
      const lag = i.oldest_pending_age_seconds !== null && i.oldest_pending_age_seconds !== undefined
        ? i.oldest_pending_age_seconds : i.processing_lag_seconds;
      const note = i.last_notification_at ? 'last Nova notification ' + ago(i.last_notification_at) : 'no Nova notification yet';
      setTile('t-lag', lag === null || lag === undefined ? '–' : duration(lag), note);
    } else setTile('t-lag', '–');
  }

  function renderTypes() {
    const box = $('types');
    if (!last.gpus) return;
    if (!last.gpus.ok) { box.replaceChildren(sectionError(last.gpus)); return; }
    const groups = new Map();
    for (const g of last.gpus.value.gpus) {
      if (g.mode === 'mixed') continue; // no one type: shown in the fleet
      const key = g.profile || g.trait || g.resource_class;
      let x = groups.get(key);
      if (!x) { x = { name: key, trait: g.trait || '', gpus: 0, cap: 0, used: 0, free: 0, hosts: new Set(), freeHosts: new Set() }; groups.set(key, x); }
      x.gpus++; x.cap += g.capacity; x.used += g.used; x.free += g.free;
      x.hosts.add(g.host || g.node);
      if (g.free > 0) x.freeHosts.add(g.host || g.node);
    }
    if (groups.size === 0) { box.replaceChildren(h('p', { class: 'empty' }, 'No GPU with vGPU inventory in Placement yet.')); return; }
    const rows = [...groups.values()].sort((a, b) => a.name.localeCompare(b.name)).map((x) =>
      h('tr', null,
        h('th', { scope: 'row' }, x.name),
        h('td', { class: 'mono' }, x.trait),
        h('td', { class: 'num' }, x.hosts.size),
        h('td', { class: 'num' }, x.gpus),
        h('td', { class: 'num' }, x.cap),
        h('td', { class: 'num' }, x.used),
        h('td', { class: 'num' }, x.free),
        h('td', null, bar(x.used, x.cap, x.used + ' of ' + x.cap + ' ' + x.name + ' vGPUs used')),
        h('td', { class: 'num' }, x.freeHosts.size)));
    box.replaceChildren(h('table', null,
      h('caption', { class: 'visually-hidden' }, 'vGPU capacity by type'),
      h('thead', null, h('tr', null,
        h('th', { scope: 'col' }, 'vGPU type'), h('th', { scope: 'col' }, 'Trait'),
        h('th', { scope: 'col', class: 'num' }, 'Hosts'), h('th', { scope: 'col', class: 'num' }, 'GPUs'),
        h('th', { scope: 'col', class: 'num' }, 'Capacity'), h('th', { scope: 'col', class: 'num' }, 'Used'),
        h('th', { scope: 'col', class: 'num' }, 'Free'), h('th', { scope: 'col' }, 'Usage'),
        h('th', { scope: 'col', class: 'num', title: 'hosts with a free vGPU of this type' }, 'With room'))),
      h('tbody', null, rows)));
  }

  function healthBadge(gh) {
    if (!gh) return h('span', { class: 'muted' }, '–');
    const cls = { ok: 'ok', degraded: 'warn', failed: 'bad' }[gh.health] || 'idle';
    return badge(cls, gh.health || 'unknown');
  }

  function agentBadges(host, s) {
    const out = [];
    if (!s || !s.last_report_at) out.push(badge('idle', 'No agent report', 'no vgpu-agent has reported for this host'));
    else if (s.stale) out.push(badge('warn', 'Agent stale · ' + ago(s.last_report_at), 'last report older than ' + duration(last.status.value.stale_report_age_seconds) + ': left out of placement'));
    else out.push(badge('ok', 'Agent · ' + ago(s.last_report_at), 'last agent report ' + new Date(s.last_report_at).toLocaleString()));
    if (host.drained) out.push(badge('warn', 'Drained', host.drain_reason || 'no new placements on this host'));
    if (host.disabled || (host.traits || []).includes('COMPUTE_STATUS_DISABLED')) {
      out.push(badge('bad', 'Disabled in Nova', host.disabled_reason || 'Nova\'s compute service is disabled: no new placements'));
    }
    return out;
  }

  function renderFleet() {
    const box = $('fleet');
    if (!last.hosts || !last.gpus) return;
    if (!last.hosts.ok) { box.replaceChildren(sectionError(last.hosts)); return; }
    if (!last.gpus.ok) { box.replaceChildren(sectionError(last.gpus)); return; }
    const sh = statusHosts();
    const byNode = new Map();
    for (const g of last.gpus.value.gpus) {
      if (!byNode.has(g.node)) byNode.set(g.node, []);
      byNode.get(g.node).push(g);
    }
    const q = $('filter').value.trim().toLowerCase();
    const hosts = last.hosts.value.hosts.slice().sort((a, b) => a.name.localeCompare(b.name));
    const cards = [];
    for (const x of hosts) {
      const gpus = (byNode.get(x.node) || []).slice().sort((a, b) => (a.pci_address || a.name).localeCompare(b.pci_address || b.name));
      if (q) {
        const hay = [x.name, x.node].concat(gpus.map((g) => [g.pci_address, g.profile, g.trait, g.name].join(' '))).join(' ').toLowerCase();
        if (!hay.includes(q)) continue;
      }
      const s = sh.get('node:' + x.node) || sh.get('name:' + x.name);
      const health = new Map();
      let vfio = 0;
      if (s) for (const gh of s.gpus || []) { health.set(gh.pci, gh); if (gh.vendor_vfio) vfio++; }
      const rows = gpus.map((g) => {
        const gh = health.get(g.pci_address);
        const util = gh && gh.util_percent !== undefined && gh.util_percent !== null ? Math.round(gh.util_percent) + ' %' : null;
        if (g.mode === 'mixed') {
          // A mixed bridge-owned GPU: framebuffer (MiB) is the limit.
          const inUse = (g.types_in_use || []).map((u) => (u.profile || u.type_id) + ' × ' + u.count).join(', ');
          return h('tr', { dataset: { gpu: g.provider_uuid, mode: 'mixed' } },
            h('th', { scope: 'row', class: 'mono nowrap', title: g.name }, g.pci_address || g.name),
            h('td', { class: 'nowrap', title: (g.traits || []).join(' ') }, 'mixed' + (inUse ? ' · ' + inUse : ''),
              g.drained ? [' ', badge('warn', 'Drained', g.drain_reason || 'no new placements on this GPU')] : null,
              g.problem ? [' ', badge('warn', 'Incomplete', g.problem)] : null),
            h('td', null, h('div', { class: 'usage' }, bar(g.used, g.capacity, g.used + ' of ' + g.capacity + ' MiB of framebuffer used'),
              h('span', { class: 'usage-text' }, g.used + ' / ' + g.capacity + ' MiB'))),
            h('td', { class: 'num' }, g.free + ' MiB'),
            h('td', { class: 'nowrap' }, healthBadge(gh || (g.health ? { health: g.health } : null)), util ? [' ', h('span', { class: 'util', title: 'GPU utilisation' }, util)] : null));
        }
        return h('tr', { dataset: { gpu: g.provider_uuid } },
          h('th', { scope: 'row', class: 'mono nowrap', title: g.name }, g.pci_address || g.name),
          h('td', { class: 'nowrap', title: g.trait || null }, g.profile || g.trait || g.resource_class,
            g.drained ? [' ', badge('warn', 'Drained', g.drain_reason || 'no new placements on this GPU')] : null),
          h('td', null, h('div', { class: 'usage' }, bar(g.used, g.capacity, g.used + ' of ' + g.capacity + ' vGPUs used'),
            h('span', { class: 'usage-text' }, g.used + ' / ' + g.capacity))),
          h('td', { class: 'num' }, g.free),
          h('td', { class: 'nowrap' }, healthBadge(gh), util ? [' ', h('span', { class: 'util', title: 'GPU utilisation' }, util)] : null));
      });
      const foot = [];
      if (s && s.errors && s.errors.length) foot.push(h('div', { class: 'bad' }, 'Agent could not read: ' + s.errors.join('; ')));
      const meta = [];
      if (s && s.agent_version) meta.push('agent ' + s.agent_version);
      if (s && s.driver_version) meta.push('driver ' + s.driver_version);
      if (vfio) meta.push(vfio + ' vendor-VFIO GPU' + (vfio === 1 ? '' : 's') + ' reported (not VGPU inventory)');
      if (meta.length) foot.push(h('div', null, meta.join(' · ')));
      cards.push(h('article', { class: 'host', 'aria-labelledby': 'host-' + x.root_provider_uuid, dataset: { host: x.name, node: x.node } },
        h('div', { class: 'host-head' },
          h('div', null,
            h('h3', { id: 'host-' + x.root_provider_uuid }, x.name),
            x.node !== x.name ? h('p', { class: 'host-node' }, 'node ' + x.node) : null,
            h('div', { class: 'badges' }, agentBadges(x, s))),
          h('div', { class: 'host-sum' },
            h('strong', null, x.used + ' / ' + x.capacity + ' used'),
            x.free + ' free · ' + x.gpu_count + ' GPU' + (x.gpu_count === 1 ? '' : 's') +
              (x.framebuffer ? ' · ' + x.framebuffer.free_mib + ' MiB of mixed framebuffer free' : ''))),
        h('div', { class: 'host-gpus' }, h('table', null,
          h('caption', { class: 'visually-hidden' }, 'GPUs of ' + x.name),
          h('thead', null, h('tr', null,
            h('th', { scope: 'col' }, 'GPU'), h('th', { scope: 'col' }, 'vGPU type'), h('th', { scope: 'col' }, 'Used'),
            h('th', { scope: 'col', class: 'num' }, 'Free'), h('th', { scope: 'col' }, 'Health'))),
          h('tbody', null, rows))),
        foot.length ? h('div', { class: 'host-foot' }, foot) : null));
    }
    if (cards.length === 0) {
      box.replaceChildren(h('p', { class: 'empty' }, q ? 'No host matches “' + q + '”.' : 'No host with GPUs in Placement yet.'));
      return;
    }
    box.replaceChildren(h('div', { class: 'hosts' }, cards));
  }

  function stateBadge(state) {
    const cls = state === 'succeeded' ? 'ok' : (state === 'failed' || state === 'rejected') ? 'bad' : 'info';
    return badge(cls, state);
  }

  function renderRequests() {
    const box = $('requests');
    if (!last.requests) return;
    if (!last.requests.ok) { box.replaceChildren(sectionError(last.requests)); return; }
    const rs = last.requests.value.requests;
    if (rs.length === 0) { box.replaceChildren(h('p', { class: 'empty' }, 'No request yet.')); return; }
    box.replaceChildren(h('table', null,
      h('caption', { class: 'visually-hidden' }, 'Recent requests'),
      h('thead', null, h('tr', null,
        h('th', { scope: 'col' }, 'Request'), h('th', { scope: 'col' }, 'Kind'), h('th', { scope: 'col' }, 'Instance'),
        h('th', { scope: 'col' }, 'State'), h('th', { scope: 'col' }, 'Phase · reason'), h('th', { scope: 'col' }, 'Updated'))),
      h('tbody', null, rs.map((r) => h('tr', { dataset: { request: r.id } },
        h('th', { scope: 'row', class: 'mono nowrap', title: 'source ' + r.source }, r.id),
        h('td', { class: 'nowrap' }, r.kind),
        h('td', { class: 'mono nowrap', title: r.instance_uuid || null }, r.instance_uuid ? r.instance_uuid.slice(0, 8) + '…' : '–'),
        h('td', null, stateBadge(r.state)),
        h('td', { class: 'reason' },
          r.phase ? h('span', null, r.phase) : null,
          r.phase && (r.reason || r.code) ? ' · ' : null,
          r.reason || null,
          r.code ? [' ', h('span', { class: 'code' }, '(' + r.code + ')')] : null,
          !r.phase && !r.reason && !r.code ? '–' : null),
        h('td', { class: 'nowrap' }, timeEl(r.updated_at)))))));
  }

  function renderIngest() {
    const box = $('ingest');
    if (!last.status) return;
    if (!last.status.ok) { box.replaceChildren(sectionError(last.status)); return; }
    const st = last.status.value;
    const i = st.ingest;
    let reporting = 0, stale = 0;
    for (const x of st.hosts) { if (x.last_report_at) { if (x.stale) stale++; else reporting++; } }
    const row = (k, ...v) => [h('dt', null, k), h('dd', null, v)];
    box.replaceChildren(h('dl', { class: 'kv' },
      row('Last Nova notification', i.last_notification_at ? timeEl(i.last_notification_at) : 'none received yet'),
      row('Nova → inbox delay', duration(i.notification_delay_seconds)),
      row('Last inbox event (any source)', i.last_event_at ? timeEl(i.last_event_at) : 'none yet'),
      row('Pending in the inbox', String(i.pending_events),
        i.oldest_pending_at ? ' · oldest waits ' + duration(i.oldest_pending_age_seconds) : ''),
      row('Processing lag (median of last 100)', duration(i.processing_lag_seconds)),
      row('Dead letters, last 24 h', i.dead_letters_24h ? badge('warn', String(i.dead_letters_24h)) : '0'),
      row('Agents', reporting + ' reporting' + (stale ? ', ' : ''), stale ? badge('warn', stale + ' stale') : '',
        ' · stale after ' + duration(st.stale_report_age_seconds))));
  }

  const DRIFT_ORDER = ['kind', 'type', 'severity', 'host', 'node', 'instance_uuid', 'provider_uuid', 'mdev_uuid', 'pci_address',
    'detail', 'message', 'description', 'reason', 'action', 'repaired', 'state', 'first_seen_at', 'detected_at', 'found_at', 'last_seen_at'];

  function driftItems(v) {
    if (Array.isArray(v)) return v;
    if (v && typeof v === 'object') {
      for (const k of ['findings', 'drift', 'items']) if (Array.isArray(v[k])) return v[k];
      for (const x of Object.values(v)) if (Array.isArray(x)) return x;
    }
    return [];
  }

  function cell(v) {
    if (v === null || v === undefined) return '–';
    if (typeof v === 'string' && /^\d{4}-\d\d-\d\dT/.test(v)) return timeEl(v);
    if (typeof v === 'object') return JSON.stringify(v);
    return String(v);
  }

  function renderDrift() {
    const box = $('drift');
    if (!last.drift) return;
    const r = last.drift;
    if (!r.ok) {
      if (r.error.status === 404) {
        box.replaceChildren(h('p', { class: 'muted' }, 'Not available: this bridge does not serve GET /v1/drift.'));
      } else box.replaceChildren(sectionError(r));
      return;
    }
    const items = driftItems(r.value);
    if (items.length === 0) {
      box.replaceChildren(h('p', { class: 'empty' }, badge('ok', 'No drift'), ' Placement, agents and the bridge agree.'));
      return;
    }
    const keys = new Set();
    for (const it of items) if (it && typeof it === 'object') Object.keys(it).forEach((k) => keys.add(k));
    const cols = DRIFT_ORDER.filter((k) => keys.has(k)).concat([...keys].filter((k) => !DRIFT_ORDER.includes(k)).sort()).slice(0, 7);
    box.replaceChildren(h('table', null,
      h('caption', { class: 'visually-hidden' }, 'Drift findings'),
      h('thead', null, h('tr', null, cols.map((c) => h('th', { scope: 'col' }, c.replace(/_/g, ' '))))),
      h('tbody', null, items.map((it) => h('tr', null, cols.map((c, n) =>
        n === 0 ? h('th', { scope: 'row' }, cell(it[c])) : h('td', { class: /uuid|pci/.test(c) ? 'mono' : null }, cell(it[c]))))))));
  }

  // --- wiring ----------------------------------------------------------------
  function init() {
    if (token) showSession();
    $('login').addEventListener('submit', (ev) => {
      ev.preventDefault();
      const t = $('token').value.trim();
      if (!t) { $('token').focus(); return; }
      token = t;
      saveToken(t);
      $('token').value = '';
      showSession();
      $('alert').hidden = true;
      refresh();
    });
    $('logout').addEventListener('click', () => {
      token = '';
      saveToken('');
      showSession();
      refresh();
      $('token').focus();
    });
    $('pause').addEventListener('click', () => {
      paused = !paused;
      $('pause').setAttribute('aria-pressed', String(paused));
      if (paused) {
        clearTimeout(timer);
        timer = null;
        $('updated').textContent = $('updated').textContent.replace(/ · every \d+ s$/, ' · paused');
      } else tick();
    });
    $('filter').addEventListener('input', renderFleet);
    document.addEventListener('visibilitychange', () => {
      if (document.hidden) { clearTimeout(timer); timer = null; } else if (!paused) tick();
    });
    tick();
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', init);
  else init();
})();
