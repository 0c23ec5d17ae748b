// The dashboard driven in headless Chromium as a person would. Run by tests/ui/run.sh, which sets
// STRIA (the binary), POOL (a served pool: 2 fast + 6 capacity drives, volumes v ec:4+2,
// t tiered:ec:4+2 with snapshot s1 and clone tc, l log:ec:4+2), URL (the dashboard), CHROMIUM and
// SHOTS (the screenshots' folder).
// Prints one line per check and last "dashboard: N passed, M failed"; exits 1 if a check failed.
import { chromium } from 'playwright-core';
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

const { STRIA, POOL, URL, SHOTS } = process.env;
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
if (!STRIA || !POOL || !URL || !SHOTS) {
  console.error('dashboard.mjs: set STRIA, POOL, URL and SHOTS (tests/ui/run.sh does)');
  process.exit(2);
}
const SOCK = path.join(POOL, 'nbd.sock');
const TOKEN = fs.readFileSync(path.join(POOL, 'http.token'), 'utf8').trim();
const T = 10000; // the longest wait for one thing in the page

let passed = 0, failed = 0;
let pageShown = false; // once the overview failed, the other checks fail at once instead of waiting
async function check(name, fn) {
  const t0 = Date.now();
  try {
    if (passed + failed > 0 && !pageShown) throw new Error('skipped: the dashboard did not show the pool');
    await fn();
    passed++;
    console.log(`ok   ${name} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}: ${e && e.message ? e.message.split('\n')[0] : e}`);
  }
}
function assert(cond, msg) { if (!cond) throw new Error(msg); }
function eq(got, want, what) { if (got !== want) throw new Error(`${what}: page shows ${JSON.stringify(got)}, expected ${JSON.stringify(want)}`); }
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// `stria status` exits non-zero when the pool is not healthy (after the failed drives): the JSON is what counts
function cliStatus() {
  const r = spawnSync(STRIA, ['status', '--pool', POOL, '--json'], { encoding: 'utf8' });
  try { return JSON.parse(r.stdout); } catch (_) { throw new Error(`stria status --json (exit ${r.status}): ${r.stderr.trim()}`); }
}
async function api(p) {
  const r = await fetch(new globalThis.URL(p, URL));
  if (!r.ok) throw new Error(`GET ${p}: HTTP ${r.status}`);
  return r.json();
}
// Writes (and reads) through NBD with qemu-io: many 64 KiB requests, for about `ms`.
function nbdLoad(vol, ms) {
  const cmds = [];
  for (let i = 0; i < 96; i++) cmds.push('-c', `write -P 0x5a ${i * 64}k 64k`);
  for (let i = 0; i < 32; i++) cmds.push('-c', `read ${i * 64}k 64k`);
  const end = Date.now() + ms;
  return new Promise((resolve, reject) => {
    const once = () => {
      const p = spawn('qemu-io', ['-f', 'raw', `nbd+unix:///${vol}?socket=${SOCK}`, ...cmds], { stdio: ['ignore', 'ignore', 'pipe'] });
      let err = '';
      p.stderr.on('data', (d) => { err += d; });
      p.on('error', reject);
      p.on('exit', (code) => {
        if (code !== 0) return reject(new Error(`qemu-io on ${vol} exited ${code}: ${err.trim()}`));
        if (Date.now() < end) setTimeout(once, 150); else resolve();
      });
    };
    once();
  });
}

const tid = (id) => `[data-testid="${id}"]`;
const pageErrors = [];
const watchdog = setTimeout(() => {
  console.log('FAIL the test took over 120 s');
  console.log(`dashboard: ${passed} passed, ${failed + 1} failed`);
  process.exit(1);
}, 120000);

const browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] });
try {
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await ctx.newPage();
  page.setDefaultTimeout(T);
  page.on('pageerror', (e) => pageErrors.push(e.message));
  // (a refused request logs "Failed to load resource" in the console: that is expected, not a script error)
  page.on('console', (m) => { if (m.type() === 'error' && !/Failed to load resource/.test(m.text())) pageErrors.push(`console: ${m.text()}`); });
  const isOpen = (id) => page.locator(tid(id)).evaluate((d) => d.open);
  const attr = (sel, a) => page.locator(sel).getAttribute(a);
  const text = async (sel) => (await page.locator(sel).innerText()).trim();
  async function until(fn, what, ms = T) {
    const end = Date.now() + ms;
    let last;
    for (;;) {
      try { if (await fn()) return; } catch (e) { last = e; }
      if (Date.now() > end) throw new Error(`timed out waiting for ${what}${last ? ` (${last.message.split('\n')[0]})` : ''}`);
      await sleep(50);
    }
  }

  // 1. the drives table and the volume cards show what `stria status --json` says
  await check('overview: drives and volumes as in `stria status --json`', async () => {
    await page.goto(URL);
    const st = cliStatus();
    await page.locator(tid(`drive-row-${st.drives[st.drives.length - 1].id}`)).waitFor();
    await page.locator(tid('volume-card-v')).waitFor();
    await page.locator(tid('volume-card-t')).waitFor();
    eq(await text(tid('pool-name')), st.name, 'pool name');
    eq(await page.locator('#drives tbody tr').count(), st.drives.length, 'number of drive rows');
    for (const d of st.drives) {
      const row = page.locator(tid(`drive-row-${d.id}`));
      eq(await text(`${tid(`drive-row-${d.id}`)} ${tid('drive-class')}`), d.class, `drive ${d.id} class`);
      eq((await text(`${tid(`drive-row-${d.id}`)} ${tid('drive-state')}`)).split(/\s+/)[0], d.state, `drive ${d.id} state`);
      eq(await row.getAttribute('data-state'), d.state, `drive ${d.id} data-state`);
    }
    const plain = st.volumes.filter((v) => v.role !== 'tier-part');
    const logs = st.log || [];
    const names = [...plain, ...logs, ...(st.clones || [])].map((v) => v.name).sort();
    const shown = (await page.locator('#volumes article').evaluateAll((a) => a.map((x) => x.dataset.name))).sort();
    eq(shown.join(','), names.join(','), 'client-visible volumes');
    for (const v of [...plain, ...logs]) {
      const card = tid(`volume-card-${v.name}`);
      eq(await text(`${card} ${tid('volume-name')}`), v.name, `volume ${v.name} name`);
      eq(await text(`${card} ${tid('volume-layout')}`), v.layout, `volume ${v.name} layout`);
      eq(await text(`${card} ${tid('volume-state')}`), v.state, `volume ${v.name} state`);
    }
    const t = logs.find((l) => l.name === 't');
    assert(t, 'status has no log entry for t');
    const roles = { cache: 'cache', meta: 'meta', seg: 'segments', segments: 'segments' };
    eq(await page.locator(`${tid('parts-t')} tbody tr`).count(), 3, 'parts of t');
    for (const p of t.parts) {
      const row = tid(`part-t-${roles[p.role]}`);
      eq(await attr(row, 'data-state'), p.state, `t's ${p.role} part state`);
      assert((await text(row)).includes(p.volume) && (await text(row)).includes(p.layout), `t's ${p.role} row lacks ${p.volume} ${p.layout}`);
    }
    assert(['cache', 'meta', 'segments'].every((r) => t.parts.some((p) => roles[p.role] === r)), 't has not the three parts');
    eq(Number(await attr(tid('cache-fill-t'), 'data-total')), t.cache_blocks, 't cache blocks');
    assert((await text(tid('wa-fast-t'))).startsWith('fast') && (await text(tid('wa-capacity-t'))).startsWith('capacity'), 'write amplification per tier not shown');
    pageShown = true;
  });

  // What the operator met: a log volume called "tiered", drive paths cut short, no snapshots or
  // clones on the page.
  await check('log volumes, snapshots, clones and whole drive paths as `stria status --json` says', async () => {
    const st = cliStatus();
    const info = async (v) => text(`${tid(`volume-card-${v}`)} ${tid('volume-info')}`);
    assert(/log-structured/.test(await info('l')) && !/tiered/.test(await info('l')), `l (log:ec:4+2) is shown as: ${await info('l')}`);
    assert(/tiered/.test(await info('t')), `t (tiered:ec:4+2) is shown as: ${await info('t')}`);
    eq((st.snapshots || []).map((s) => `${s.volume}@${s.name}`).join(), 't@s1', 'snapshots in `stria status --json`');
    await page.locator(tid('snapshot-t-s1')).waitFor();
    eq(await attr(tid('snapshot-t-s1'), 'data-export'), 't@s1', 'the snapshot\'s export');
    await page.locator(tid('clone-t-tc')).waitFor();
    assert((await info('tc')).includes('clone of t@s1'), `tc is shown as: ${await info('tc')}`);
    eq(await text(`${tid('volume-card-tc')} ${tid('volume-layout')}`), 'tiered:ec:4+2', 'the clone\'s layout (its origin\'s)');
    for (const d of st.drives) {
      const cell = page.locator(`${tid(`drive-row-${d.id}`)} ${tid('drive-path')}`);
      eq(await cell.innerText(), d.path, `drive ${d.id} path`);
      const cut = await cell.evaluate((e) => e.scrollWidth > e.clientWidth + 1);
      assert(!cut, `drive ${d.id}'s path is cut in the page`);
    }
  });

  // 2. the charts receive data while the page is open and NBD clients write
  await check('charts: IOPS, MB/s and p99 latency after writes through NBD', async () => {
    await Promise.all([nbdLoad('v', 3000), nbdLoad('t', 3000)]);
    for (const v of ['v', 't']) {
      await until(async () => Number(await attr(tid(`chart-iops-${v}`), 'data-max')) > 0, `IOPS of ${v} > 0`);
      await until(async () => Number(await attr(tid(`chart-bw-${v}`), 'data-max')) > 0, `MB/s of ${v} > 0`);
      await until(async () => Number(await attr(tid(`chart-lat-${v}`), 'data-points')) > 0, `a p99 latency of ${v}`);
    }
    await until(async () => Number(await attr(tid('chart-wa-t'), 'data-points')) > 0, 'write amplification samples of t');
    const iops = Number(await attr(tid('chart-iops-v'), 'data-max'));
    console.log(`     v: max ${iops.toFixed(0)} IOPS, ${Number(await attr(tid('chart-bw-v'), 'data-max')).toFixed(1)} MB/s, ` +
      `p99 ${(await page.locator(tid('legend-lat-v')).evaluate((e) => [...e.children].map((c) => c.textContent).join(', ')))}`);
    await page.screenshot({ path: path.join(SHOTS, 'overview.png'), fullPage: true });
  });

  // 3. Scrub of v without a token: the page asks for it, then confirms, then shows the scrub to its end
  await check('scrub v: token asked, confirmed, progress bar to done, job done in the API', async () => {
    await page.evaluate(() => sessionStorage.clear());
    const jobsBefore = await api('/api/v1/jobs');
    await page.click(tid('scrub-v'));
    await until(() => isOpen('token-dialog'), 'the token dialog');
    assert(!(await isOpen('confirm-dialog')), 'the confirmation came before the token');
    await page.fill(tid('token-input'), TOKEN);
    await page.click(tid('token-ok'));
    await until(() => isOpen('confirm-dialog'), 'the confirmation dialog');
    const msg = await text(tid('confirm-text'));
    assert(/Volume v\b/.test(msg) && /scrub/i.test(msg), `the confirmation does not say what happens: ${msg}`);
    await page.screenshot({ path: path.join(SHOTS, 'confirm-dialog.png') });
    assert((await api('/api/v1/jobs')).length === jobsBefore.length, 'a job started before the confirmation');
    eq(await page.evaluate(() => sessionStorage.getItem('stria.token')), TOKEN, 'the token in sessionStorage');
    await page.click(tid('confirm-ok'));
    const bar = page.locator(tid('scrub-progress-v'));
    await bar.waitFor();
    const seen = new Set();
    await until(async () => { const s = await bar.getAttribute('data-state'); seen.add(s); return s === 'done'; }, 'the scrub bar to show done');
    const done = Number(await bar.getAttribute('data-done')), total = Number(await bar.getAttribute('data-total'));
    assert(total > 0 && done === total, `the scrub bar is at ${done}/${total}`);
    const job = Number(await bar.getAttribute('data-job'));
    const j = await api(`/api/v1/jobs/${job}`);
    eq(j.op, 'scrub', 'job op'); eq(j.state, 'done', 'job state'); eq(j.request && j.request.name, 'v', 'job volume');
    assert(j.progress && j.progress.done === j.progress.total, 'the job did not report its progress to the end');
    await page.locator(`${tid(`job-row-${job}`)}[data-state="done"]`).waitFor();
    // Once done it is listed as finished, not under "In progress".
    await page.locator(`${tid('finished-section')} ${tid('scrub-progress-v')}`).waitFor();
    eq(await page.locator(`${tid('progress-section')} ${tid('scrub-progress-v')}`).count(), 0, 'finished scrub bars under "In progress"');
    console.log(`     job ${job}: states seen in the page ${[...seen].join(' -> ')}, ${total} rows, ${(j.finished_unix_ms - j.started_unix_ms)} ms`);
    await page.screenshot({ path: path.join(SHOTS, 'scrub-progress.png') });
  });

  // 5 (before 4, on an intact pool). A wrong token: the page asks again and nothing changes.
  await check('wrong token: 401 handled, token asked again, pool unchanged', async () => {
    const before = cliStatus();
    await page.click(tid('token-button'));
    await until(() => isOpen('token-dialog'), 'the token dialog');
    await page.fill(tid('token-input'), 'not-the-token');
    await page.click(tid('token-ok'));
    await page.click(tid('fail-drive-5'));
    await until(() => isOpen('confirm-dialog'), 'the confirmation dialog');
    await page.click(tid('confirm-ok'));
    await until(() => isOpen('token-dialog'), 'the token dialog after the 401');
    assert(/refused/i.test(await text(tid('token-reason'))), 'the token dialog does not say the token was refused');
    await page.locator(tid('error-banner')).waitFor();
    eq(await attr(tid('error-banner'), 'data-status'), '401', 'the error banner status');
    await page.click(tid('token-cancel'));
    const after = cliStatus();
    eq(after.generation, before.generation, 'pool generation');
    eq(after.drives.map((d) => d.state).join(), before.drives.map((d) => d.state).join(), 'drive states');
    eq(await attr(tid('drive-row-5'), 'data-state'), 'active', 'drive 5 in the page');
  });

  // 4. Refusal: ec:4+2 survives two failed capacity drives; failing a third is refused by the daemon
  await check('refusal: the daemon\'s "last in-sync copy" message shown in the page', async () => {
    await page.click(tid('error-close'));
    await page.click(tid('token-button'));
    await until(() => isOpen('token-dialog'), 'the token dialog');
    await page.fill(tid('token-input'), TOKEN);
    await page.click(tid('token-ok'));
    for (const id of [2, 3]) {
      await page.click(tid(`fail-drive-${id}`));
      await until(() => isOpen('confirm-dialog'), 'the confirmation dialog');
      const msg = await text(tid('confirm-text'));
      assert(msg.includes(`Drive ${id} `) && /will be failed/.test(msg) && /\bv\b/.test(msg) && /\bt\b/.test(msg),
        `the confirmation does not say what happens: ${msg}`);
      await page.click(tid('confirm-ok'));
      await page.locator(`${tid(`drive-row-${id}`)}[data-state="failed"]`).waitFor();
    }
    await page.locator(`${tid('volume-card-v')}[data-state="degraded"]`).waitFor();
    await page.click(tid('fail-drive-4'));
    await until(() => isOpen('confirm-dialog'), 'the confirmation dialog');
    await page.click(tid('confirm-ok'));
    await page.locator(tid('error-banner')).waitFor();
    const shown = await text(tid('error-banner'));
    assert(/last in-sync copy/.test(shown), `the banner does not show the daemon's message: ${shown}`);
    eq(await attr(tid('error-banner'), 'data-status'), '409', 'the error banner status');
    const st = cliStatus();
    eq(st.drives.find((d) => d.id === 4).state, 'active', 'drive 4 after the refusal');
    eq(await attr(tid('drive-row-4'), 'data-state'), 'active', 'drive 4 in the page');
    await page.screenshot({ path: path.join(SHOTS, 'refusal.png') });
  });

  // Replace the two failed drives from the page: new drives appear, the volumes rebuild and are healthy again
  await check('replace drives 2 and 3: rebuilt, volumes healthy again', async () => {
    await page.click(tid('error-close'));
    const seen = new Set();
    const watch = setInterval(async () => {
      try {
        for (const e of await page.locator('[data-testid^="rebuild-progress-"]').all()) seen.add(await e.getAttribute('data-testid'));
      } catch (_) { /* the page re-rendered */ }
    }, 50);
    try {
      for (const id of [2, 3]) {
        await page.click(tid(`replace-drive-${id}`));
        await until(() => isOpen('confirm-dialog'), 'the confirmation dialog');
        const msg = await text(tid('confirm-text'));
        assert(msg.includes(`Drive ${id} `) && /replaced by a new empty file/.test(msg), `the confirmation does not say what happens: ${msg}`);
        await page.click(tid('confirm-ok'));
        await page.locator(tid(`drive-row-${id}`)).waitFor({ state: 'detached' });
      }
      await page.locator(`${tid('volume-card-v')}[data-state="healthy"]`).waitFor({ timeout: 30000 });
      await page.locator(`${tid('volume-card-t')}[data-state="healthy"]`).waitFor({ timeout: 30000 });
      // Every volume (the log volume, the snapshots and clones too), as `stria status` says.
      await until(() => cliStatus().volumes.every((v) => v.state === 'healthy'), 'every volume healthy in `stria status`', 30000);
    } finally { clearInterval(watch); }
    const st = cliStatus();
    eq(st.drives.filter((d) => d.state === 'active').length, 8, 'active drives in `stria status`');
    eq(await page.locator('#drives tbody tr[data-state="active"]').count(), 8, 'active drive rows');
    assert(st.volumes.every((v) => v.state === 'healthy'), 'a volume is not healthy in `stria status`');
    console.log(`     rebuild bars seen: ${[...seen].join(', ') || 'none (the rebuilds ended between two polls)'}`);
  });

  // 6. the screenshots and no script errors
  await check('screenshots written, no script errors in the page', async () => {
    for (const f of ['overview.png', 'scrub-progress.png', 'confirm-dialog.png', 'refusal.png']) {
      const p = path.join(SHOTS, f);
      assert(fs.existsSync(p) && fs.statSync(p).size > 10000, `${p} missing or empty`);
    }
    assert(pageErrors.length === 0, `errors in the page: ${pageErrors.join('; ')}`);
  });
} catch (e) {
  failed++;
  console.log(`FAIL ${e && e.message ? e.message : e}`);
} finally {
  await browser.close().catch(() => {});
  clearTimeout(watchdog);
}
console.log(`dashboard: ${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
