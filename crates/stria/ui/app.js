// The stria dashboard: plain JavaScript, no framework, no build step, no network but the daemon's.
// It polls GET /api/v1/status, /api/v1/stats and /api/v1/jobs, draws its own charts on <canvas>,
// and sends actions (scrub, fail, replace, rebalance) with the pool's API token after a confirmation.
'use strict';
(() => {
  const API = '/api/v1';
  const WINDOW_MS = 5 * 60 * 1000; // the charts keep 5 minutes of samples
  const POLL_MS = 1000;
  const FAST_POLL_MS = 200; // jobs, while one is running or was just asked for
  const FINISHED_SHOWN_MS = 120 * 1000; // a finished scrub keeps its (full) bar this long
  const TOKEN_KEY = 'stria.token';
  const COLORS = { read: '#2f6fd6', write: '#d9762b', fast: '#8a4fd0', capacity: '#1f9d8a' };

  const S = {
    status: null,
    statusAt: 0,
    jobs: [],
    prevStats: null, // the previous raw /stats sample
    series: new Map(), // volume -> [{t, riops, wiops, rmb, wmb, rp99, wp99}]
    driveRates: new Map(), // drive id -> {rmb, wmb, riops, wiops}
    wa: new Map(), // tiered volume -> [{t, fast, capacity}]
    myJobs: new Map(), // job id -> what the page asked for (to report how it ended)
    fastJobsUntil: 0,
    online: null,
  };

  // ---------- small helpers ----------
  const $ = (sel, root = document) => root.querySelector(sel);
  function el(tag, attrs = {}, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'class') e.className = v;
      else if (k === 'text') e.textContent = v;
      else if (k === 'testid') e.dataset.testid = v;
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? '' : v);
    }
    for (const c of kids.flat()) if (c !== null && c !== undefined) e.append(c);
    return e;
  }
  function fmtBytes(n) {
    if (n === null || n === undefined || !isFinite(n)) return '–';
    const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
    let i = 0;
    while (Math.abs(n) >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return (i === 0 ? n.toFixed(0) : n.toFixed(n >= 100 ? 0 : n >= 10 ? 1 : 2)) + ' ' + u[i];
  }
  function fmtNum(v, digits = 1) {
    if (v === null || v === undefined || !isFinite(v)) return '–';
    const a = Math.abs(v);
    if (a >= 1e6) return (v / 1e6).toFixed(1) + 'M';
    if (a >= 1e4) return (v / 1e3).toFixed(0) + 'k';
    if (a >= 1e3) return (v / 1e3).toFixed(1) + 'k';
    if (a >= 100 || Number.isInteger(v)) return v.toFixed(0);
    return v.toFixed(digits);
  }
  function fmtMs(v) {
    if (v === null || v === undefined || !isFinite(v)) return '–';
    if (v >= 1000) return (v / 1000).toFixed(2) + ' s';
    if (v >= 1) return v.toFixed(v >= 100 ? 0 : 1) + ' ms';
    return (v * 1000).toFixed(0) + ' µs';
  }
  const pct = (a, b) => (b > 0 ? Math.max(0, Math.min(100, (100 * a) / b)) : 0);
  const stateClass = (s) => 'st-' + String(s || 'unknown').replace(/[^a-z-]/gi, '');
  const clock = (ms) => new Date(ms).toLocaleTimeString();

  async function getJSON(path) {
    const r = await fetch(API + path, { cache: 'no-store' });
    if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
    return r.json();
  }

  // ---------- banners ----------
  function showError(msg, code) {
    const b = $('#error-banner');
    $('#error-text').textContent = msg;
    b.dataset.status = code === undefined ? '' : String(code);
    b.hidden = false;
  }
  function hideError() { $('#error-banner').hidden = true; }
  let toastTimer = null;
  function toast(msg) {
    const t = $('#toast');
    t.textContent = msg;
    t.hidden = false;
    clearTimeout(toastTimer);
    toastTimer = setTimeout(() => { t.hidden = true; }, 6000);
  }

  // ---------- token ----------
  const getToken = () => sessionStorage.getItem(TOKEN_KEY) || '';
  function setToken(t) {
    if (t) sessionStorage.setItem(TOKEN_KEY, t); else sessionStorage.removeItem(TOKEN_KEY);
    $('#token-btn').textContent = t ? 'Change token' : 'Set token';
    $('#token-btn').dataset.hasToken = t ? 'yes' : 'no';
  }
  let tokenThen = null;
  function askToken(reason, then) {
    tokenThen = then || null;
    $('#token-reason').textContent = reason;
    const d = $('#token-dialog');
    $('#token-input').value = '';
    if (!d.open) d.showModal();
    $('#token-input').focus();
  }
  function tokenDialogSetup() {
    const d = $('#token-dialog');
    $('#token-form').addEventListener('submit', (e) => {
      e.preventDefault();
      const cancel = e.submitter && e.submitter.value === 'cancel';
      const v = $('#token-input').value.trim();
      if (!cancel && !v) { $('#token-input').focus(); return; }
      d.close();
      const then = tokenThen;
      tokenThen = null;
      if (cancel) return;
      setToken(v);
      if (then) then();
      else toast('Token kept for this tab.');
    });
    d.addEventListener('cancel', () => { tokenThen = null; });
    $('#token-btn').addEventListener('click', () => askToken('Enter the pool\'s API token.', null));
  }

  // ---------- confirmation and sending ----------
  let confirmThen = null;
  function confirmAction(action) {
    const d = $('#confirm-dialog');
    $('#confirm-title').textContent = action.title;
    $('#confirm-text').textContent = action.text;
    $('#confirm-ok').textContent = action.label || 'Confirm';
    $('#confirm-ok').className = action.danger ? 'danger' : 'primary';
    $('#confirm-force-row').hidden = !action.forceable;
    $('#confirm-force').checked = false;
    d.dataset.action = action.key;
    d.returnValue = '';
    confirmThen = action;
    d.showModal();
    $('#confirm-cancel').focus();
  }
  function confirmDialogSetup() {
    const d = $('#confirm-dialog');
    d.addEventListener('close', () => {
      const a = confirmThen;
      confirmThen = null;
      if (a && d.returnValue === 'ok') {
        const force = a.forceable && $('#confirm-force').checked;
        send(a, force);
      }
    });
  }
  // An action: ask the token first if there is none, then confirm, then send.
  function requestAction(action) {
    if (!getToken()) askToken('This action needs the pool\'s API token.', () => confirmAction(action));
    else confirmAction(action);
  }
  async function send(action, force) {
    let body = action.body ? { ...action.body } : undefined;
    if (force) body = { ...(body || {}), force: true };
    let r, data = null;
    try {
      r = await fetch(API + action.path, {
        method: action.method,
        headers: { Authorization: 'Bearer ' + getToken(), 'Content-Type': 'application/json' },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      try { data = await r.json(); } catch (_) { data = null; }
    } catch (e) {
      showError(`${action.title}: the daemon could not be reached (${e.message})`);
      return;
    }
    const msg = data && data.error ? data.error : `HTTP ${r.status}`;
    if (r.status === 401) {
      setToken('');
      showError(`The daemon refused the token (401): ${msg}`, 401);
      askToken('The daemon refused the token. Enter the token from POOL_DIR/http.token again.', () => confirmAction(action));
      return;
    }
    if (!r.ok) {
      showError(`${action.title} refused by the daemon (${r.status}): ${msg}`, r.status);
      refreshStatus();
      return;
    }
    hideError();
    if (data && data.job !== undefined) {
      S.myJobs.set(data.job, action.title);
      toast(`${action.title}: started as job ${data.job}.`);
    } else {
      toast(`${action.title}: done.`);
    }
    S.fastJobsUntil = Date.now() + 5000;
    refreshStatus();
    refreshJobs();
  }

  // Which client-visible volumes have data on drives of this class.
  function volumesOnClass(cls) {
    const st = S.status;
    const names = new Set();
    const partOf = new Map();
    for (const l of st.log || []) for (const p of l.parts || []) partOf.set(p.volume, l.name);
    for (const v of st.volumes || []) {
      if (v.class !== cls) continue;
      names.add(v.role === 'tier-part' ? partOf.get(v.name) || v.name.split('.')[0] : v.name);
    }
    return [...names];
  }
  const list = (a) => (a.length ? a.join(', ') : 'none');

  function failAction(d) {
    const vols = volumesOnClass(d.class);
    const spare = (S.status.drives || []).some((x) => x.state === 'spare' && x.class === d.class);
    let text = `Drive ${d.id} (${d.class}, ${d.path}) will be failed: stria stops reading and writing it. `;
    text += vols.length
      ? `Volumes ${list(vols)} run degraded until it is replaced` + (spare ? ' (a spare drive of this class takes over and they rebuild onto it).' : '.')
      : 'No volume has data on this class of drives.';
    return { key: `fail-${d.id}`, title: `Fail drive ${d.id}`, label: `Fail drive ${d.id}`, text,
      method: 'POST', path: `/drives/${d.id}/fail`, body: {}, forceable: true, danger: true };
  }
  function replaceAction(d) {
    const vols = volumesOnClass(d.class);
    const text = `Drive ${d.id} (${d.class}, ${d.path}) will be replaced by a new empty file of the same size (${fmtBytes(d.size_bytes)}). ` +
      (vols.length ? `Volumes ${list(vols)} are rebuilt onto it; they run degraded until the rebuild ends.` : 'No volume has data on this class of drives.');
    return { key: `replace-${d.id}`, title: `Replace drive ${d.id}`, label: `Replace drive ${d.id}`, text,
      method: 'POST', path: `/drives/${d.id}/replace`, body: {}, danger: true };
  }
  function scrubAction(v) {
    const text = `Volume ${v.name} (${v.layout}, ${fmtBytes(v.size_bytes)}) will be scrubbed: every row is read and checked against its checksums ` +
      'and parity, and damaged blocks are repaired from the other copies. It runs in the background; the volume stays online.';
    return { key: `scrub-${v.name}`, title: `Scrub volume ${v.name}`, label: 'Scrub', text,
      method: 'POST', path: `/volumes/${encodeURIComponent(v.name)}/scrub` };
  }
  function rebalanceAction() {
    return { key: 'rebalance', title: 'Rebalance the pool', label: 'Rebalance',
      text: 'Extents will be moved between drives of the same class so that each holds a similar share. It runs in the background; volumes stay online.',
      method: 'POST', path: '/pool/rebalance' };
  }

  // ---------- charts ----------
  function niceMax(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 4, 6, 8, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }
  // series: [{label, color, points: [[t, v|null], ...]}]; opts: {fmt}
  function drawChart(canvas, series, opts = {}) {
    const dpr = window.devicePixelRatio || 1;
    const w = canvas.clientWidth || 300, h = canvas.clientHeight || 120;
    if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
      canvas.width = Math.round(w * dpr);
      canvas.height = Math.round(h * dpr);
    }
    const ctx = canvas.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    const L = 46, R = 6, T = 6, B = 16;
    // the time axis: the last 5 minutes, or less while there are fewer samples (at least 1 minute)
    const now = Date.now();
    let first = now;
    for (const s of series) if (s.points.length) first = Math.min(first, s.points[0][0]);
    const span = Math.min(WINDOW_MS, Math.max(60000, now - first));
    const t0 = now - span;
    let max = 0, npts = 0;
    for (const s of series) for (const [t, v] of s.points) if (v !== null && t >= t0) { max = Math.max(max, v); npts++; }
    const ymax = niceMax(max);
    const X = (t) => L + ((t - t0) / span) * (w - L - R);
    const Y = (v) => T + (1 - v / ymax) * (h - T - B);
    const fmt = opts.fmt || fmtNum;
    ctx.font = '10px system-ui, sans-serif';
    ctx.lineWidth = 1;
    ctx.strokeStyle = '#e3e6ea';
    ctx.fillStyle = '#6b7280';
    ctx.textAlign = 'right';
    ctx.textBaseline = 'middle';
    for (let i = 0; i <= 4; i++) {
      const v = (ymax * i) / 4, y = Math.round(Y(v)) + 0.5;
      ctx.beginPath(); ctx.moveTo(L, y); ctx.lineTo(w - R, y); ctx.stroke();
      ctx.fillText(fmt(v), L - 4, y);
    }
    ctx.textAlign = 'center';
    ctx.textBaseline = 'alphabetic';
    const step = [10000, 15000, 30000, 60000].find((s) => span / s <= 6) || 60000;
    for (let k = Math.floor(span / step); k >= 0; k--) {
      const ago = k * step, x = X(now - ago);
      const label = ago === 0 ? 'now' : ago % 60000 === 0 ? `-${ago / 60000}m` : `-${ago / 1000}s`;
      ctx.fillText(label, Math.min(Math.max(x, L + 8), w - R - 10), h - 3);
    }
    ctx.lineWidth = 1.6;
    for (const s of series) {
      ctx.strokeStyle = s.color;
      ctx.beginPath();
      let pen = false;
      for (const [t, v] of s.points) {
        if (t < t0 || v === null) { pen = false; continue; }
        if (pen) ctx.lineTo(X(t), Y(v)); else { ctx.moveTo(X(t), Y(v)); pen = true; }
      }
      ctx.stroke();
      // the newest sample as a dot (a single sample is no line yet)
      const lastPt = s.points.length ? s.points[s.points.length - 1] : null;
      if (lastPt && lastPt[1] !== null && lastPt[0] >= t0) {
        ctx.fillStyle = s.color;
        ctx.beginPath(); ctx.arc(X(lastPt[0]), Y(lastPt[1]), 2.2, 0, 2 * Math.PI); ctx.fill();
      }
    }
    if (npts === 0) {
      ctx.fillStyle = '#9ca3af';
      ctx.textAlign = 'center';
      ctx.fillText('no samples yet', (L + w) / 2, h / 2);
    }
    canvas.dataset.points = String(npts);
    canvas.dataset.max = String(max);
  }

  // ---------- stats: rates and percentiles from two samples ----------
  function percentileNs(buckets, upper, q) {
    let total = 0;
    for (const c of buckets) total += c;
    if (total <= 0) return null;
    const rank = Math.ceil(q * total);
    let cum = 0;
    for (let i = 0; i < buckets.length; i++) {
      cum += buckets[i];
      if (cum >= rank) {
        // The last bucket is open (its bound is u64::MAX): report the bound below it.
        return i === upper.length - 1 && i > 0 ? upper[i - 1] : upper[i];
      }
    }
    return upper[upper.length - 1];
  }
  function opDelta(a, b) {
    if (!a || !b) return null;
    const d = { count: b.count - a.count, bytes: b.bytes - a.bytes, buckets: [] };
    if (d.count < 0 || d.bytes < 0) return null;
    const ab = (a.latency && a.latency.buckets) || [], bb = (b.latency && b.latency.buckets) || [];
    for (let i = 0; i < bb.length; i++) d.buckets.push(Math.max(0, bb[i] - (ab[i] || 0)));
    return d;
  }
  function onStats(cur) {
    const now = Date.now();
    const prev = S.prevStats;
    S.prevStats = cur;
    if (!prev || !(cur.time_ms > prev.time_ms)) return;
    const dt = (cur.time_ms - prev.time_ms) / 1000;
    const upper = cur.bucket_upper_ns || [];
    const prevVols = new Map((prev.volumes || []).map((v) => [v.name, v]));
    for (const v of cur.volumes || []) {
      const p = prevVols.get(v.name);
      if (!p) continue;
      const r = opDelta(p.read, v.read), wr = opDelta(p.write, v.write);
      const wz = opDelta(p.write_zeroes, v.write_zeroes), tr = opDelta(p.trim, v.trim), fl = opDelta(p.flush, v.flush);
      if (!r || !wr) continue; // counters went back (a restart): skip this pair
      const otherW = (wz ? wz.count : 0) + (tr ? tr.count : 0) + (fl ? fl.count : 0);
      const rp = percentileNs(r.buckets, upper, 0.99), wp = percentileNs(wr.buckets, upper, 0.99);
      const pt = {
        t: now,
        riops: r.count / dt,
        wiops: (wr.count + otherW) / dt,
        rmb: r.bytes / dt / 1e6,
        wmb: wr.bytes / dt / 1e6,
        rp99: rp === null ? null : rp / 1e6,
        wp99: wp === null ? null : wp / 1e6,
        inflight: v.in_flight,
      };
      if (!S.series.has(v.name)) S.series.set(v.name, []);
      const a = S.series.get(v.name);
      a.push(pt);
      while (a.length && a[0].t < now - WINDOW_MS) a.shift();
    }
    const prevDrives = new Map((prev.drives || []).map((d) => [d.id, d]));
    for (const d of cur.drives || []) {
      const p = prevDrives.get(d.id);
      if (!p) continue;
      S.driveRates.set(d.id, {
        riops: Math.max(0, d.read_ops - p.read_ops) / dt, wiops: Math.max(0, d.write_ops - p.write_ops) / dt,
        rmb: Math.max(0, d.read_bytes - p.read_bytes) / dt / 1e6, wmb: Math.max(0, d.write_bytes - p.write_bytes) / dt / 1e6,
      });
    }
    renderCharts();
    renderDriveRates();
  }

  // ---------- rendering: header, capacity ----------
  // The volumes clients see (as `stria volume list`): plain ones, tiered and log volumes (not their
  // parts) and clones, which live in their origin's parts and share its state.
  function clientVolumes(st) {
    const out = [];
    for (const v of st.volumes || []) if (v.role !== 'tier-part') out.push({ kind: 'plain', ...v });
    for (const l of st.log || []) out.push({ kind: 'log', ...l });
    for (const c of st.clones || []) {
      const origin = (st.log || []).find((l) => l.name === c.origin);
      out.push({ ...c, kind: 'clone', layout: origin ? origin.layout : '', state: origin ? origin.state : 'unknown' });
    }
    out.sort((a, b) => a.name.localeCompare(b.name));
    return out;
  }
  // What a log-structured volume is, by its layout: tiered (cache and map on fast drives) or log.
  const logKind = (layout) => (String(layout).startsWith('tiered:')
    ? 'tiered (cache and map on fast drives, segments on capacity drives)'
    : 'log-structured (cache, map and segments on capacity drives)');
  function renderHeader(st) {
    $('#pool-name').textContent = st.name || '(pool)';
    document.title = `stria: ${st.name || 'pool'}`;
    const drives = st.drives || [], vols = clientVolumes(st);
    const count = (arr, f) => { const m = {}; for (const x of arr) m[f(x)] = (m[f(x)] || 0) + 1; return m; };
    const ds = count(drives, (d) => d.state), vs = count(vols, (v) => v.state);
    const parts = (m) => Object.entries(m).map(([k, n]) => `${n} ${k}`).join(', ');
    let overall = 'healthy';
    if (drives.some((d) => d.state === 'failed' || d.state === 'missing') ||
        vols.some((v) => v.state === 'degraded' || v.state === 'rebuilding')) overall = 'degraded';
    if (vols.some((v) => v.state === 'failed')) overall = 'failed';
    if (st.suspended) overall = 'suspended';
    const b = $('#pool-state');
    b.textContent = overall;
    b.className = 'badge ' + stateClass(overall === 'suspended' ? 'degraded' : overall);
    b.dataset.state = overall;
    $('#pool-summary').textContent = `${drives.length} drives (${parts(ds)}) · ${vols.length} volumes (${parts(vs) || 'none'})` +
      (st.rebalance ? ' · rebalancing' : '') + ` · generation ${st.generation}`;
  }
  function renderCapacity(st) {
    const box = $('#capacity');
    const by = new Map();
    for (const d of st.drives || []) {
      if (!by.has(d.class)) by.set(d.class, { size: 0, used: 0, n: 0, out: 0 });
      const c = by.get(d.class);
      if (d.state === 'active') { c.size += d.size_bytes || 0; c.used += d.used_bytes || 0; c.n++; } else c.out++;
    }
    box.replaceChildren(...[...by.entries()].map(([cls, c]) => {
      const p = pct(c.used, c.size);
      return el('div', { class: 'cap', testid: `capacity-${cls}`, 'data-used': c.used, 'data-size': c.size },
        el('div', { class: 'cap-head' }, el('b', { text: cls }),
          el('span', { class: 'muted', text: ` ${c.n} active drive${c.n === 1 ? '' : 's'}` + (c.out ? `, ${c.out} out` : '') })),
        bar(p, `${fmtBytes(c.used)} used of ${fmtBytes(c.size)} (${p.toFixed(0)}%) · ${fmtBytes(c.size - c.used)} free`, p > 90 ? 'failed' : p > 75 ? 'degraded' : 'healthy'));
    }));
  }
  function bar(p, label, tone, attrs = {}) {
    return el('div', { class: `bar tone-${tone || 'info'}`, ...attrs },
      el('div', { class: 'fill', style: `width:${p.toFixed(1)}%` }), el('span', { class: 'bar-label', text: label }));
  }

  // ---------- drives ----------
  function renderDrives(st) {
    const tb = $('#drives tbody');
    const seen = new Set();
    for (const d of st.drives || []) {
      seen.add(String(d.id));
      let tr = tb.querySelector(`tr[data-id="${d.id}"]`);
      if (!tr) {
        tr = el('tr', { 'data-id': d.id, testid: `drive-row-${d.id}` },
          el('td', { class: 'num', testid: 'drive-id', text: d.id }),
          el('td', { testid: 'drive-class' }), el('td', { testid: 'drive-domain' }),
          el('td', { testid: 'drive-state' }), el('td', { class: 'usage-col', testid: 'drive-usage' }),
          el('td', { class: 'errs', testid: 'drive-errors' }), el('td', { class: 'path', testid: 'drive-path' }),
          el('td', { class: 'actions' },
            el('button', { testid: `fail-drive-${d.id}`, class: 'danger small', text: 'Fail',
              onclick: () => { const x = driveById(d.id); if (x) requestAction(failAction(x)); } }),
            el('button', { testid: `replace-drive-${d.id}`, class: 'small', text: 'Replace',
              onclick: () => { const x = driveById(d.id); if (x) requestAction(replaceAction(x)); } })));
        // keep the rows in id order
        const after = [...tb.children].find((r) => Number(r.dataset.id) > d.id);
        tb.insertBefore(tr, after || null);
      }
      tr.dataset.state = d.state;
      tr.dataset.class = d.class;
      tr.className = stateClass(d.state);
      const c = tr.children;
      c[1].textContent = d.class;
      c[2].textContent = d.domain || '–';
      c[3].replaceChildren(el('span', { class: `badge ${stateClass(d.state)}`, text: d.state }),
        ...(d.draining ? [el('span', { class: 'badge st-draining', text: 'draining' })] : []));
      if (d.failed_reason) c[3].title = d.failed_reason; else c[3].removeAttribute('title');
      const p = pct(d.used_bytes, d.size_bytes);
      const rate = el('div', { class: 'rate muted', testid: 'drive-rate' });
      c[4].replaceChildren(bar(p, `${fmtBytes(d.used_bytes)} / ${fmtBytes(d.size_bytes)}`, d.state === 'active' ? 'info' : 'off'), rate);
      const errs = [d.read_errors || 0, d.write_errors || 0, d.checksum_repairs || 0];
      c[5].textContent = errs.join(' / ');
      c[5].classList.toggle('bad', errs.some((x) => x > 0));
      c[6].textContent = d.path;
      c[6].title = d.path;
      tr.querySelector(`[data-testid="fail-drive-${d.id}"]`).disabled = d.state !== 'active';
      tr.querySelector(`[data-testid="replace-drive-${d.id}"]`).disabled = d.state === 'spare';
    }
    for (const tr of [...tb.children]) if (!seen.has(tr.dataset.id)) tr.remove();
    renderDriveRates();
  }
  function renderDriveRates() {
    for (const tr of document.querySelectorAll('#drives tbody tr')) {
      const r = S.driveRates.get(Number(tr.dataset.id));
      const e = tr.querySelector('[data-testid="drive-rate"]');
      if (e) e.textContent = r ? `r ${fmtNum(r.rmb)} MB/s · w ${fmtNum(r.wmb)} MB/s · ${fmtNum(r.riops + r.wiops)} IOPS` : '';
    }
  }
  const driveById = (id) => (S.status ? (S.status.drives || []).find((d) => d.id === id) : null);

  // ---------- volumes ----------
  const roleName = (r) => (r === 'seg' ? 'segments' : r);
  function makeCard(v) {
    const name = v.name;
    const chart = (kind, title) => el('div', { class: 'chart' },
      el('div', { class: 'chart-head' }, el('span', { class: 'chart-title', text: title }), el('span', { class: 'legend', testid: `legend-${kind}-${name}` })),
      el('canvas', { testid: `chart-${kind}-${name}`, 'data-points': '0', 'data-max': '0' }));
    const charts = [chart('iops', 'IOPS'), chart('bw', 'bandwidth MB/s'), chart('lat', 'p99 latency')];
    if (v.kind === 'log') charts.push(chart('wa', 'write amplification'));
    return el('article', { class: 'card', 'data-name': name, testid: `volume-card-${name}` },
      el('div', { class: 'card-head' },
        el('h3', { testid: 'volume-name', text: name }),
        el('span', { class: 'layout', testid: 'volume-layout' }),
        el('span', { class: 'badge', testid: 'volume-state' }),
        el('span', { class: 'muted', testid: 'volume-info' }),
        el('span', { class: 'spacer' }),
        el('span', { class: 'now', testid: `now-${name}` }),
        el('button', { testid: `scrub-${name}`, class: 'small', text: 'Scrub',
          onclick: () => { const x = clientVolumes(S.status || {}).find((y) => y.name === name); if (x) requestAction(scrubAction(x)); } })),
      el('div', { class: 'card-body', testid: 'volume-details' }),
      el('div', { class: `charts n${charts.length}` }, charts));
  }
  // A log-structured volume's snapshots (read-only exports VOLUME@SNAPSHOT) and clones.
  function familyOf(st, name) {
    const snaps = (st.snapshots || []).filter((s) => s.volume === name);
    const clones = (st.clones || []).filter((c) => c.origin === name);
    const when = (ms) => (ms ? new Date(ms).toLocaleString() : '');
    return el('div', { class: 'family', testid: `family-${name}` },
      el('div', { class: 'label', text: `snapshots (${snaps.length})` }),
      snaps.length === 0 ? el('div', { class: 'muted small', text: 'none' }) :
        el('ul', { testid: `snapshots-${name}` }, snaps.map((s) => el('li', { testid: `snapshot-${name}-${s.name}`, 'data-export': s.export },
          el('span', { class: 'mono', text: s.name }), el('span', { class: 'muted', text: ` · export ${s.export} (read-only) · ${when(s.created_ms)}` })))),
      el('div', { class: 'label', text: `clones (${clones.length})` }),
      clones.length === 0 ? el('div', { class: 'muted small', text: 'none' }) :
        el('ul', { testid: `clones-${name}` }, clones.map((c) => el('li', { testid: `clone-${name}-${c.name}` },
          el('span', { class: 'mono', text: c.name }), el('span', { class: 'muted', text: ` · of snapshot ${c.snapshot} · ${when(c.created_ms)}` })))));
  }
  function renderVolumes(st) {
    const box = $('#volumes');
    const vols = clientVolumes(st);
    const byName = new Map((st.volumes || []).map((v) => [v.name, v]));
    const seen = new Set();
    for (const v of vols) {
      seen.add(v.name);
      let card = box.querySelector(`article[data-name="${CSS.escape(v.name)}"]`);
      if (!card || card.dataset.kind !== v.kind) {
        if (card) card.remove();
        card = makeCard(v);
        card.dataset.kind = v.kind;
        box.append(card);
      }
      card.dataset.state = v.state;
      card.dataset.layout = v.layout;
      card.className = `card ${stateClass(v.state)}`;
      $('[data-testid="volume-layout"]', card).textContent = v.layout;
      const sb = $('[data-testid="volume-state"]', card);
      sb.textContent = v.state;
      sb.className = `badge ${stateClass(v.state)}`;
      const body = $('[data-testid="volume-details"]', card);
      if (v.kind === 'clone') {
        $('[data-testid="volume-info"]', card).textContent =
          `${fmtBytes(v.size_bytes)} · clone of ${v.origin}@${v.snapshot} (writable; shares its data, lives in ${v.origin}'s space)`;
        body.replaceChildren();
        body.hidden = true;
      } else if (v.kind === 'plain') {
        $('[data-testid="volume-info"]', card).textContent = `${fmtBytes(v.size_bytes)} · ${v.class} drives`;
        const bits = [];
        if (v.degraded_reads) bits.push(`${v.degraded_reads} degraded reads`);
        if (v.repaired_blocks) bits.push(`${v.repaired_blocks} blocks repaired`);
        body.replaceChildren(el('span', { class: 'muted', text: bits.join(' · ') }));
        body.hidden = bits.length === 0;
      } else {
        $('[data-testid="volume-info"]', card).textContent = `${fmtBytes(v.size_bytes)} · ${logKind(v.layout)}`;
        body.hidden = false;
        const rows = (v.parts || []).slice().sort((a, b) => ['cache', 'meta', 'seg', 'segments'].indexOf(a.role) - ['cache', 'meta', 'seg', 'segments'].indexOf(b.role))
          .map((p) => {
            const sv = byName.get(p.volume) || {};
            return el('tr', { testid: `part-${v.name}-${roleName(p.role)}`, 'data-role': roleName(p.role), 'data-state': p.state, class: stateClass(p.state) },
              el('td', { text: roleName(p.role) }), el('td', { class: 'mono', text: p.volume }), el('td', { text: p.layout }),
              el('td', {}, el('span', { class: `badge ${stateClass(p.state)}`, text: p.state })),
              el('td', { class: 'muted', text: `${fmtBytes(p.size_bytes)}${sv.class ? ' · ' + sv.class : ''}` }));
          });
        const cp = pct(v.cache_live_blocks, v.cache_blocks);
        const fmtWa = (x) => (x === null || x === undefined ? '–' : x.toFixed(2) + '×');
        body.replaceChildren(
          el('table', { class: 'parts', testid: `parts-${v.name}` },
            el('thead', {}, el('tr', {}, ['part', 'volume', 'layout', 'state', 'size'].map((h) => el('th', { text: h })))),
            el('tbody', {}, rows)),
          el('div', { class: 'tier-stats' },
            el('div', {}, el('div', { class: 'label', text: 'cache fill' }),
              bar(cp, `${fmtNum(v.cache_live_blocks)} / ${fmtNum(v.cache_blocks)} blocks (${cp.toFixed(0)}%)`, 'info',
                { testid: `cache-fill-${v.name}`, 'data-live': v.cache_live_blocks, 'data-total': v.cache_blocks })),
            el('div', { class: 'wa' },
              el('div', { class: 'label', text: 'write amplification' }),
              el('span', { testid: `wa-fast-${v.name}`, 'data-value': v.write_amplification_fast },
                el('i', { class: 'dot', style: `background:${COLORS.fast}` }), `fast ${fmtWa(v.write_amplification_fast)}`),
              el('span', { testid: `wa-capacity-${v.name}`, 'data-value': v.write_amplification_capacity },
                el('i', { class: 'dot', style: `background:${COLORS.capacity}` }), `capacity ${fmtWa(v.write_amplification_capacity)}`)),
            el('div', { class: 'muted small' },
              `space ${fmtBytes((v.space_bytes || 0) - (v.free_bytes || 0))} used of ${fmtBytes(v.space_bytes)} · ` +
              `${v.free_segments ?? '–'} of ${v.segments ?? '–'} segments free`)),
          familyOf(st, v.name));
      }
    }
    for (const c of [...box.children]) if (!seen.has(c.dataset.name)) c.remove();
    // write amplification over time
    const now = Date.now();
    for (const l of st.log || []) {
      if (!S.wa.has(l.name)) S.wa.set(l.name, []);
      const a = S.wa.get(l.name);
      a.push({ t: now, fast: l.write_amplification_fast ?? null, capacity: l.write_amplification_capacity ?? null });
      while (a.length && a[0].t < now - WINDOW_MS) a.shift();
    }
  }
  function renderCharts() {
    for (const card of document.querySelectorAll('#volumes article')) {
      const name = card.dataset.name;
      const pts = S.series.get(name) || [];
      const P = (f) => pts.map((p) => [p.t, f(p)]);
      const last = pts[pts.length - 1];
      const q = (k) => card.querySelector(`[data-testid="${k}-${name}"]`);
      const legend = (kind, items) => {
        const e = q(`legend-${kind}`);
        if (e) e.replaceChildren(...items.map(([c, t]) => el('span', {}, el('i', { class: 'dot', style: `background:${c}` }), t)));
      };
      const iops = q('chart-iops');
      if (iops) {
        drawChart(iops, [{ color: COLORS.read, points: P((p) => p.riops) }, { color: COLORS.write, points: P((p) => p.wiops) }]);
        iops.dataset.last = last ? String(last.riops + last.wiops) : '0';
        legend('iops', [[COLORS.read, `read ${fmtNum(last && last.riops)}`], [COLORS.write, `write ${fmtNum(last && last.wiops)}`]]);
      }
      const bw = q('chart-bw');
      if (bw) {
        drawChart(bw, [{ color: COLORS.read, points: P((p) => p.rmb) }, { color: COLORS.write, points: P((p) => p.wmb) }]);
        bw.dataset.last = last ? String(last.rmb + last.wmb) : '0';
        legend('bw', [[COLORS.read, `read ${fmtNum(last && last.rmb)}`], [COLORS.write, `write ${fmtNum(last && last.wmb)}`]]);
      }
      const lat = q('chart-lat');
      if (lat) {
        drawChart(lat, [{ color: COLORS.read, points: P((p) => p.rp99) }, { color: COLORS.write, points: P((p) => p.wp99) }], { fmt: fmtMs });
        legend('lat', [[COLORS.read, `read ${fmtMs(last && last.rp99)}`], [COLORS.write, `write ${fmtMs(last && last.wp99)}`]]);
      }
      const wa = q('chart-wa');
      if (wa) {
        const a = S.wa.get(name) || [];
        drawChart(wa, [{ color: COLORS.fast, points: a.map((p) => [p.t, p.fast]) }, { color: COLORS.capacity, points: a.map((p) => [p.t, p.capacity]) }],
          { fmt: (v) => v.toFixed(v >= 10 ? 0 : 1) + '×' });
        const l = a[a.length - 1];
        legend('wa', [[COLORS.fast, `fast ${l && l.fast !== null ? l.fast.toFixed(2) : '–'}`], [COLORS.capacity, `capacity ${l && l.capacity !== null ? l.capacity.toFixed(2) : '–'}`]]);
      }
      const now = q('now');
      if (now) now.textContent = last ? `${fmtNum(last.riops + last.wiops)} IOPS · ${fmtNum(last.rmb + last.wmb)} MB/s · ${last.inflight ?? 0} in flight` : '';
    }
  }

  // ---------- progress: rebuilds, scrubs, rebalance ----------
  function renderProgress() {
    const st = S.status;
    if (!st) return;
    const items = [];
    for (const v of st.volumes || []) {
      const r = v.rebuild;
      if (!r) continue;
      const p = pct(r.rows_done, r.rows_total);
      items.push(el('div', { class: 'prog' }, el('span', { class: 'prog-what', text: `rebuild ${v.name}` }),
        bar(p, `${fmtNum(r.rows_done)} / ${fmtNum(r.rows_total)} rows (${p.toFixed(0)}%)`, 'degraded',
          { testid: `rebuild-progress-${v.name}`, 'data-done': r.rows_done, 'data-total': r.rows_total, 'data-state': 'running' })));
    }
    const rb = st.rebalance;
    if (rb) {
      const c = rb.current;
      const p = c ? pct(c.rows_done, c.rows_total) : 0;
      const label = c ? `${c.volume}: drive ${c.from_drive} → ${c.to_drive}, ${fmtNum(c.rows_done)} / ${fmtNum(c.rows_total)} rows · ${rb.moves_done} moves done`
        : `${rb.moves_done ?? 0} moves done` + (rb.draining ? ' (draining)' : '');
      items.push(el('div', { class: 'prog' }, el('span', { class: 'prog-what', text: 'rebalance' }),
        bar(p, label, 'info', { testid: 'rebalance-progress', 'data-done': c ? c.rows_done : 0, 'data-total': c ? c.rows_total : 0, 'data-state': 'running' })));
    }
    // the newest scrub of each volume, running or recently finished
    const finished = [];
    const now = Date.now();
    const scrubs = new Map();
    for (const j of S.jobs) {
      if (j.op !== 'scrub') continue;
      const name = (j.request && j.request.name) || '?';
      if (j.state !== 'running' && !(j.finished_unix_ms && now - j.finished_unix_ms < FINISHED_SHOWN_MS)) continue;
      if (!scrubs.has(name) || scrubs.get(name).id < j.id) scrubs.set(name, j);
    }
    for (const [name, j] of [...scrubs.entries()].sort()) {
      const pr = j.progress || { done: j.state === 'done' ? 1 : 0, total: 1 };
      const p = j.state === 'done' ? 100 : pct(pr.done, pr.total);
      const label = j.state === 'running' ? `${pr.what || 'scrub'}: ${fmtNum(pr.done)} / ${fmtNum(pr.total)} rows (${p.toFixed(0)}%)`
        : j.state === 'done' ? `done: ${fmtNum(pr.total)} rows, ${j.result ? (j.result.blocks_repaired ?? 0) + ' blocks repaired' : ''}`
          : `failed: ${j.error || ''}`;
      (j.state === 'running' ? items : finished).push(el('div', { class: 'prog' }, el('span', { class: 'prog-what', text: `scrub ${name} (job ${j.id})` }),
        bar(p, label, j.state === 'failed' ? 'failed' : j.state === 'done' ? 'healthy' : 'info',
          { testid: `scrub-progress-${name}`, 'data-state': j.state, 'data-job': j.id, 'data-done': pr.done, 'data-total': pr.total })));
    }
    // What runs, and apart from it what ended in the last minutes (never "in progress").
    $('#progress-list').replaceChildren(...items);
    $('#progress-section').hidden = items.length === 0;
    $('#finished-list').replaceChildren(...finished);
    $('#finished-section').hidden = finished.length === 0;
  }

  // ---------- jobs ----------
  function renderJobs() {
    const tb = $('#jobs tbody');
    const jobs = S.jobs.slice().sort((a, b) => b.id - a.id).slice(0, 15);
    tb.replaceChildren(...jobs.map((j) => {
      const pr = j.progress;
      const what = j.request ? Object.entries(j.request).filter(([k]) => k !== 'op').map(([k, v]) => `${k}=${typeof v === 'object' ? JSON.stringify(v) : v}`).join(' ') : '';
      let res = '';
      if (j.error) res = j.error;
      else if (j.result) res = typeof j.result === 'object' ? Object.entries(j.result).filter(([, v]) => typeof v !== 'object').map(([k, v]) => `${k} ${v}`).join(', ') : String(j.result);
      const dur = j.finished_unix_ms ? ` (${((j.finished_unix_ms - j.started_unix_ms) / 1000).toFixed(2)} s)` : '';
      return el('tr', { testid: `job-row-${j.id}`, 'data-state': j.state, 'data-op': j.op, class: stateClass(j.state === 'done' ? 'healthy' : j.state === 'failed' ? 'failed' : 'rebuilding') },
        el('td', { class: 'num', text: j.id }), el('td', { text: `${j.op} ${what}` }),
        el('td', {}, el('span', { class: `badge ${stateClass(j.state === 'done' ? 'healthy' : j.state === 'failed' ? 'failed' : 'rebuilding')}`, text: j.state })),
        el('td', { text: pr ? `${fmtNum(pr.done)} / ${fmtNum(pr.total)}` : '' }),
        el('td', { text: clock(j.started_unix_ms) + dur }), el('td', { class: 'result', text: res, title: res }));
    }));
    $('#jobs-empty').hidden = jobs.length > 0;
    $('#jobs').hidden = jobs.length === 0;
  }
  function noteMyJobs() {
    for (const j of S.jobs) {
      const title = S.myJobs.get(j.id);
      if (!title || j.state === 'running') continue;
      S.myJobs.delete(j.id);
      if (j.state === 'failed') showError(`${title} (job ${j.id}) failed: ${j.error || 'no reason given'}`);
      else toast(`${title} (job ${j.id}): ${j.state}.`);
    }
  }

  // ---------- polling ----------
  function setOnline(ok, why) {
    if (S.online === ok && ok) { $('#conn').textContent = `live · ${clock(Date.now())}`; return; }
    S.online = ok;
    const c = $('#conn');
    c.textContent = ok ? `live · ${clock(Date.now())}` : `daemon unreachable (${why})`;
    c.className = ok ? 'muted' : 'bad';
    c.dataset.online = ok ? 'yes' : 'no';
  }
  async function refreshStatus() {
    try {
      const st = await getJSON('/status');
      S.status = st;
      S.statusAt = Date.now();
      renderHeader(st);
      renderCapacity(st);
      renderDrives(st);
      renderVolumes(st);
      renderProgress();
      document.body.dataset.ready = 'yes';
      setOnline(true);
    } catch (e) {
      setOnline(false, e.message);
    }
  }
  async function refreshStats() {
    try { onStats(await getJSON('/stats')); } catch (e) { setOnline(false, e.message); }
  }
  async function refreshJobs() {
    try {
      const j = await getJSON('/jobs');
      S.jobs = Array.isArray(j) ? j : j.jobs || [];
      if (S.jobs.some((x) => x.state === 'running')) S.fastJobsUntil = Math.max(S.fastJobsUntil, Date.now() + 1000);
      renderJobs();
      renderProgress();
      noteMyJobs();
    } catch (e) { setOnline(false, e.message); }
  }
  function loop(fn, ms) {
    const tick = async () => {
      await fn();
      setTimeout(tick, typeof ms === 'function' ? ms() : ms);
    };
    tick();
  }

  function init() {
    tokenDialogSetup();
    confirmDialogSetup();
    setToken(getToken());
    $('#error-close').addEventListener('click', hideError);
    $('#rebalance-btn').addEventListener('click', () => requestAction(rebalanceAction()));
    loop(refreshStatus, POLL_MS);
    loop(refreshStats, POLL_MS);
    loop(refreshJobs, () => (Date.now() < S.fastJobsUntil ? FAST_POLL_MS : POLL_MS));
    window.addEventListener('resize', renderCharts);
  }
  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', init); else init();
})();
