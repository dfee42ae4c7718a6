// Browser tests of the admin portal: Playwright's core library drives Debian's Chromium against a
// server started by run.sh (PORTAL_BASE_URL, PORTAL_ADMIN_PASSWORD). Data is seeded through the
// public API; every step after that goes through the UI. Each test saves a screenshot to
// docs/screenshots/.
import { test, before, after, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import { readFile, mkdir, mkdtemp, chmod, rm } from 'node:fs/promises';
import { spawn } from 'node:child_process';
import { createServer } from 'node:net';
import { randomBytes } from 'node:crypto';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '..');
const shots = path.join(repo, 'docs', 'screenshots');
const fixtures = path.join(repo, 'tests', 'fixtures', 'upstream');
const BASE = process.env.PORTAL_BASE_URL;
const ADMIN_PASSWORD = process.env.PORTAL_ADMIN_PASSWORD;
const CHROMIUM = process.env.CHROMIUM_PATH || '/usr/bin/chromium';
if (!BASE || !ADMIN_PASSWORD) throw new Error('run these tests through portal-tests/run.sh');

let browser;
let adminToken;
const pageErrors = [];
const foreignRequests = [];
const contexts = [];

// A 2x2 PNG, as an attachment to preview.
const PNG = Buffer.from(
  'iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR4nGP4z8DAwMDAxMDAwMDAAAANHQEDasKb6QAAAABJRU5ErkJggg==',
  'base64',
);

let adminTokenAt = 0;

/** An admin token for seeding and checks; access tokens live only PORTAL_JWT_TTL seconds here. */
async function admin() {
  if (Date.now() - adminTokenAt > 8_000) {
    adminToken = await login('admin', ADMIN_PASSWORD);
    adminTokenAt = Date.now();
  }
  return adminToken;
}

async function api(method, p, { token, json, body, headers = {} } = {}) {
  const h = { ...headers };
  const bearer = token === undefined ? await admin() : token;
  if (bearer) h.Authorization = `Bearer ${bearer}`;
  let payload = body;
  if (json !== undefined) {
    h['Content-Type'] = 'application/json';
    payload = JSON.stringify(json);
  }
  const res = await fetch(`${BASE}/${p.replace(/^\//, '')}`, { method, headers: h, body: payload });
  const text = await res.text();
  let data = text;
  try {
    data = JSON.parse(text);
  } catch {
    // Not JSON: kept as text.
  }
  return { status: res.status, data };
}

async function login(username, password) {
  const res = await api('POST', 'auth/login', { token: null, json: { username, password } });
  assert.equal(res.status, 200, JSON.stringify(res.data));
  return res.data.token;
}

async function pushFixture(name, transmissionId) {
  const payload = JSON.parse(await readFile(path.join(fixtures, name), 'utf8'));
  if (transmissionId) payload.transmission_id = transmissionId;
  const res = await api('POST', 'sync/push', { json: payload });
  assert.equal(res.status, 200, JSON.stringify(res.data));
}

before(async () => {
  await mkdir(shots, { recursive: true });
  // Ten records, then an update of one of them: obs_001 gets a history of two revisions.
  await pushFixture('test_observations.json');
  await pushFixture('test_update_observations.json');
  // A record with a photo, and the photo itself.
  const put = await api('PUT', 'attachments/photo-portal-1.png', {
    body: PNG,
    headers: { 'Content-Type': 'image/png' },
  });
  assert.equal(put.status, 200, JSON.stringify(put.data));
  const push = await api('POST', 'sync/push', {
    json: {
      transmission_id: 'portal-photo-1',
      client_id: 'tablet-portal-07',
      records: [{
        observation_id: 'obs_photo_1', form_type: 'household', form_version: '1.0',
        data: { head_name: 'Amina', photo: { type: 'image', id: 'photo-portal-1', filename: 'photo-portal-1.png' } },
        created_at: '2026-01-10T08:00:00Z', updated_at: '2026-01-10T08:00:00Z', deleted: false,
      }],
    },
  });
  assert.equal(push.status, 200, JSON.stringify(push.data));

  // Playwright gives every launch a fresh, temporary profile (its own --user-data-dir).
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: [
      '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
      '--disable-dev-shm-usage',
    ],
  });
});

after(async () => {
  for (const c of contexts) await c.close().catch(() => {});
  if (browser) await browser.close();
  assert.deepEqual(foreignRequests, [], 'the portal made requests to other hosts');
});

afterEach(() => {
  const errors = pageErrors.splice(0);
  assert.deepEqual(errors, [], 'the page raised JavaScript errors');
});

async function newPage(viewport = { width: 1280, height: 900 }, origin = BASE) {
  const context = await browser.newContext({ viewport, acceptDownloads: true });
  contexts.push(context);
  const page = await context.newPage();
  page.setDefaultTimeout(15_000);
  page.on('pageerror', (e) => pageErrors.push(String(e)));
  page.on('console', (m) => {
    if (m.type() === 'error' && !/status of 4\d\d/.test(m.text())) pageErrors.push(m.text());
  });
  page.on('request', (r) => {
    const url = r.url();
    if (!url.startsWith(origin) && !url.startsWith('blob:') && !url.startsWith('data:')) foreignRequests.push(url);
  });
  return page;
}

async function signIn(page, username = 'admin', password = ADMIN_PASSWORD, start = '/portal/') {
  await page.goto(`${BASE}${start}`);
  await page.getByLabel('User name').fill(username);
  await page.getByLabel('Password').fill(password);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('button', { name: 'Sign out' }).waitFor();
}

const shot = (page, name) => page.screenshot({ path: path.join(shots, `${name}.png`), fullPage: true });

async function go(page, hash) {
  await page.evaluate((h) => {
    location.hash = h;
  }, hash);
  await page.waitForFunction(() => !document.getElementById('main').hasAttribute('aria-busy'));
}

async function upload(page, file, activate) {
  await go(page, '#/bundles');
  await page.setInputFiles('#bundle-file', file);
  await page.getByLabel('Make it the active version').setChecked(activate);
  await page.getByRole('button', { name: 'Upload', exact: true }).click();
  await page.locator('#upload-result .ok, #upload-result .error').first().waitFor();
}

test('GET / sends browsers to the portal, which asks them to sign in', async () => {
  const page = await newPage();
  const res = await page.goto(`${BASE}/`);
  assert.equal(new URL(res.url()).pathname, '/portal/');
  await page.getByRole('heading', { name: 'Sign in' }).waitFor();
  // API clients still get the JSON descriptor.
  const json = await api('GET', '', { token: null });
  assert.equal(json.data.service, 'synkronus');
  // The wrong password shows the API's own message.
  await page.getByLabel('User name').fill('admin');
  await page.getByLabel('Password').fill('wrong-password');
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('alert').getByText('Invalid credentials').waitFor();
  await shot(page, 'sign-in');
});

test('sign in, see the overview, sign out revokes the token', async () => {
  const page = await newPage();
  await signIn(page, 'admin', ADMIN_PASSWORD, '/portal');
  assert.equal(new URL(page.url()).pathname, '/portal/');
  await page.locator('#observation-count').getByText('11').waitFor();
  await page.locator('svg.chart').first().waitFor();
  await page.getByText('Observations by form type').first().waitFor();
  const server = await page.locator('#server-version').textContent();
  assert.match(server, /^1\./);
  await shot(page, 'overview');

  const token = await page.evaluate(() => JSON.parse(sessionStorage.getItem('synkronus.portal.session')).token);
  assert.equal((await api('GET', 'auth/me', { token })).status, 200);
  await page.getByRole('button', { name: 'Sign out' }).click();
  await page.getByRole('heading', { name: 'Sign in' }).waitFor();
  await page.getByText('You have signed out.').waitFor();
  assert.equal((await api('GET', 'auth/me', { token })).status, 401);
  assert.equal(await page.evaluate(() => sessionStorage.getItem('synkronus.portal.session')), null);
});

test('an expired access token is renewed through /auth/refresh', async () => {
  const page = await newPage();
  await signIn(page);
  const refreshes = [];
  page.on('request', (r) => {
    if (r.url().endsWith('/auth/refresh')) refreshes.push(r.url());
  });
  // Hide the expiry from the portal so that the server's TOKEN_EXPIRED answer drives the refresh.
  const old = await page.evaluate(() => {
    const s = JSON.parse(sessionStorage.getItem('synkronus.portal.session'));
    sessionStorage.setItem('synkronus.portal.session', JSON.stringify({ ...s, expiresAt: s.expiresAt + 86400 }));
    return s;
  });
  await page.reload();
  await page.getByRole('button', { name: 'Sign out' }).waitFor();
  const ttl = Number(process.env.PORTAL_JWT_TTL || 20);
  const deadline = Date.now() + (ttl + 5) * 1000;
  while ((await api('GET', 'auth/me', { token: old.token })).status === 200) {
    assert.ok(Date.now() < deadline, 'the access token did not expire');
    await new Promise((r) => setTimeout(r, 500));
  }
  await go(page, '#/users');
  await page.locator('tr', { hasText: 'admin' }).first().waitFor();
  assert.equal(refreshes.length, 1);
  const now = await page.evaluate(() => JSON.parse(sessionStorage.getItem('synkronus.portal.session')));
  assert.notEqual(now.token, old.token);
  assert.notEqual(now.refreshToken, old.refreshToken);
  assert.equal((await api('GET', 'auth/me', { token: now.token })).status, 200);
});

test('upload the fixture bundle with a progress bar and activate it', async () => {
  const page = await newPage();
  await signIn(page);
  await upload(page, path.join(fixtures, 'valid_bundle01.zip'), true);
  const result = await page.locator('#upload-result').textContent();
  assert.match(result, /Uploaded version \d{8}-\d{6}(-\d+)? and made it active/);
  assert.equal(await page.locator('.progress progress').evaluate((p) => p.value), 1);
  const version = await page.locator('#upload-result code').textContent();
  await page.locator('#manifest-version').getByText(version).waitFor();
  await page.locator('tr.active code').getByText(version, { exact: true }).waitFor();
  await shot(page, 'bundle-upload');
});

test('a broken bundle is rejected with every validation problem listed', async () => {
  const page = await newPage();
  await signIn(page);
  const before = (await api('GET', 'app-bundle/versions')).data.versions.length;
  await upload(page, path.join(here, 'fixtures', 'broken_bundle.zip'), false);
  const box = page.locator('#upload-result .error');
  await box.getByText('INVALID_BUNDLE').waitFor();
  const problems = await box.locator('.problems li').allTextContents();
  assert.equal(problems.length, 3, problems.join('\n'));
  assert.ok(problems.some((p) => p.includes('readme.txt') && p.includes('UNEXPECTED_ENTRY')), problems.join('\n'));
  assert.ok(problems.some((p) => p.includes('MISSING_APP_INDEX')), problems.join('\n'));
  assert.equal((await api('GET', 'app-bundle/versions')).data.versions.length, before);
  await shot(page, 'bundle-invalid');
});

test('compare versions, switch, see the manifest change, roll back, browse files', async () => {
  const page = await newPage();
  await signIn(page);
  if (!(await api('GET', 'app-bundle/versions')).data.versions.some((v) => v.active)) {
    await upload(page, path.join(fixtures, 'valid_bundle01.zip'), true);
  }
  await upload(page, path.join(fixtures, 'valid_bundle02.zip'), false);
  const second = await page.locator('#upload-result code').textContent();
  const first = (await api('GET', 'app-bundle/manifest')).data.version;
  assert.notEqual(first, second);
  await page.locator('#manifest-version').getByText(first).waitFor();

  // The changes from the active version to the new one.
  await page.getByRole('button', { name: 'Compare' }).click();
  await page.locator('#compare-result').getByText('app/THIS_IS_VERSION_2.txt').waitFor();
  await page.locator('#compare-result .modified').getByText('forms/example/schema.json').waitFor();

  // Switch, with a confirmation.
  await page.getByRole('button', { name: `Switch to ${second}` }).click();
  await page.getByRole('dialog').getByRole('button', { name: 'Switch' }).click();
  await page.locator('#manifest-version').getByText(second).waitFor();
  const manifest = (await api('GET', 'app-bundle/manifest')).data;
  assert.equal(manifest.version, second);
  assert.ok(manifest.files.some((f) => f.path === 'app/THIS_IS_VERSION_2.txt'));
  await page.locator('#manifest-files').getByText(new RegExp(`^${manifest.files.length} `)).waitFor();
  await shot(page, 'bundle-switch');

  // Roll back: the older version is offered as a roll-back; cancelling changes nothing.
  await page.getByRole('button', { name: `Roll back to ${first}` }).click();
  await page.getByRole('dialog').getByRole('button', { name: 'Cancel' }).click();
  assert.equal((await api('GET', 'app-bundle/manifest')).data.version, second);
  await page.getByRole('button', { name: `Roll back to ${first}` }).click();
  await page.getByRole('dialog').getByRole('button', { name: 'Roll back' }).click();
  await page.locator('#manifest-version').getByText(first).waitFor();
  assert.equal((await api('GET', 'app-bundle/manifest')).data.version, first);

  // The files of the inactive version, read from its ZIP; a JSON file opens formatted.
  await go(page, `#/bundles/${second}`);
  await page.getByRole('button', { name: 'app/THIS_IS_VERSION_2.txt' }).waitFor();
  await page.getByRole('button', { name: 'forms/example/schema.json' }).click();
  await page.locator('#file-preview pre').getByText('"properties"').waitFor();
  await shot(page, 'bundle-files');
});

test('create a user, change its role, and sign in as them', async () => {
  const page = await newPage();
  await signIn(page);
  await go(page, '#/users');
  const form = page.locator('form.grid-form');
  // The API's own message for a weak password.
  await form.getByLabel('User name').fill('enum-portal');
  await form.getByLabel('Password').fill('short');
  await page.evaluate(() => document.querySelector('form.grid-form input[type=password]').removeAttribute('minlength'));
  await form.getByLabel('Role').selectOption('read-write');
  await page.getByRole('button', { name: 'Create user' }).click();
  await page.getByRole('alert').getByText('WEAK_PASSWORD').waitFor();
  await form.getByLabel('Password').fill('enumerator-pass-1');
  await page.getByRole('button', { name: 'Create user' }).click();
  await page.getByText('Created enum-portal (read-write).').waitFor();
  const row = page.locator('tr', { hasText: 'enum-portal' });
  await row.getByLabel('Role of enum-portal', { exact: true }).selectOption('read-only');
  await row.getByRole('button', { name: 'Save the role of enum-portal' }).click();
  await page.getByText('enum-portal is now read-only.').first().waitFor();
  assert.equal((await api('GET', 'users/enum-portal')).data.role, 'read-only');
  await shot(page, 'users');

  const other = await newPage();
  await signIn(other, 'enum-portal', 'enumerator-pass-1');
  const nav = await other.getByRole('navigation', { name: 'Main' }).textContent();
  assert.ok(!nav.includes('Users') && !nav.includes('Devices'), nav);
  await other.locator('#manifest-version').or(other.locator('.stats')).first().waitFor();
  await go(other, '#/bundles');
  assert.equal(await other.getByRole('button', { name: 'Upload', exact: true }).count(), 0);
  assert.equal(await other.getByRole('button', { name: /^Roll back to|^Switch to/ }).count(), 0);
  await go(other, '#/users');
  await other.getByText('This page is for admins.').waitFor();
  await go(other, '#/overview');
  await other.locator('#active-bundle').waitFor();
  await shot(other, 'read-only-user');
});

test('browse a pushed observation: its JSON, history and attachment', async () => {
  const page = await newPage();
  await signIn(page);
  await go(page, '#/observations');
  await page.getByLabel('Form type').fill('person_registration');
  await page.getByRole('button', { name: 'Search' }).click();
  // The unfiltered first page (11 observations) is on screen until the search's answer replaces it.
  await page.getByText('10 observations.', { exact: true }).waitFor();
  const rows = await page.locator('tbody tr').count();
  assert.equal(rows, 10);
  await page.getByRole('link', { name: 'obs_001' }).click();
  await page.locator('#record-json').getByText('"observation_id": "obs_001"').waitFor();
  await page.locator('#history tr.revision').nth(1).waitFor();
  assert.equal(await page.locator('#history tr.revision').count(), 2);
  await shot(page, 'observation-history');

  // Look-up by id, then the photo previewed from the attachment store.
  await go(page, '#/observations');
  await page.getByLabel('Observation id').fill('obs_photo_1');
  await page.getByRole('button', { name: 'Open' }).click();
  const img = page.locator('#attachments img');
  await img.waitFor();
  await page.waitForFunction(() => document.querySelector('#attachments img').naturalWidth > 0);
  const download = page.waitForEvent('download');
  await page.getByRole('button', { name: 'Download photo-portal-1.png' }).click();
  assert.equal((await download).suggestedFilename(), 'photo-portal-1.png');
  await shot(page, 'observation-attachment');
});

test('run an export job to completion and download it', async () => {
  const page = await newPage();
  await signIn(page);
  await go(page, '#/exports');
  await page.getByLabel('CSV (ZIP, one file per form type)').check();
  await page.getByRole('button', { name: 'Run as a job' }).click();
  const job = page.locator('#jobs li.job').first();
  await job.locator('button.job-download').waitFor({ timeout: 30_000 });
  assert.equal(await job.getAttribute('data-state'), 'done');
  assert.equal(await job.locator('progress').evaluate((p) => p.value), 1);
  const download = page.waitForEvent('download');
  await job.locator('button.job-download').click();
  const file = await download;
  assert.equal(file.suggestedFilename(), 'observations_export_csv.zip');
  const bytes = await readFile(await file.path());
  assert.equal(bytes.subarray(0, 2).toString(), 'PK');
  await shot(page, 'export-job');

  // A streamed format without a job.
  await page.getByLabel('Raw JSON (ZIP, one file per record)').check();
  assert.ok(await page.getByRole('button', { name: 'Run as a job' }).isDisabled());
  const raw = page.waitForEvent('download');
  await page.getByRole('button', { name: 'Download now' }).click();
  assert.equal((await raw).suggestedFilename().endsWith('.zip'), true);
});

test('devices: presence with cursor lag; the layout works at 375 px', async () => {
  // Presence is written off the request path: wait until the pushes' devices are listed.
  for (let i = 0; i < 40; i += 1) {
    const list = (await api('GET', 'devices')).data;
    if (list.some((d) => d.client_id === 'tablet-portal-07')) break;
    await new Promise((r) => setTimeout(r, 250));
  }
  const page = await newPage();
  await signIn(page);
  await go(page, '#/devices');
  await page.locator('tbody tr', { hasText: 'tablet-portal-07' }).waitFor();
  await page.locator('tbody tr', { hasText: 'test-client-001' }).getByText(/behind/).waitFor();
  await shot(page, 'devices');

  const phone = await newPage({ width: 375, height: 812 });
  await signIn(phone);
  await phone.locator('#observation-count').waitFor();
  await phone.locator('svg.chart').first().waitFor();
  const overflow = await phone.evaluate(() => document.documentElement.scrollWidth);
  assert.ok(overflow <= 375, `the page is ${overflow}px wide at 375px`);
  await shot(phone, 'overview-mobile');
});

/**
 * Starts navigating to `from` while the answer of the request matching `held` is withheld, moves
 * on to `to` and lets that page finish loading, then releases the held answer and waits until the
 * abandoned render has had every chance to paint.
 */
async function navigateAwayDuringLoad(page, { held, from, to }) {
  let release;
  const released = new Promise((resolve) => {
    release = resolve;
  });
  let arrived;
  const holding = new Promise((resolve) => {
    arrived = resolve;
  });
  await page.route(held, async (route) => {
    arrived();
    await released;
    await route.continue();
  });
  await page.evaluate((h) => {
    location.hash = h;
  }, from);
  await holding;
  await go(page, to);
  const finished = page.waitForEvent('requestfinished', (r) => held.test(r.url()));
  release();
  await finished;
  // The abandoned render's continuation runs on the next turns of the event loop.
  await page.evaluate(() => new Promise((r) => setTimeout(r, 300)));
  await page.unroute(held);
}

test('fast navigation never paints a page that finished loading after the user left it', async () => {
  const page = await newPage();
  await signIn(page);

  // My account waits for /auth/me; the user goes on to Devices before it answers.
  await navigateAwayDuringLoad(page, { held: /\/auth\/me$/, from: '#/account', to: '#/devices' });
  const main = page.locator('#main');
  assert.deepEqual(await main.locator('h1').allTextContents(), ['Devices']);
  assert.equal(await main.getByRole('heading', { name: 'Change password' }).count(), 0);
  assert.equal(await page.title(), 'Devices · Synkronus');
  assert.equal(await page.evaluate(() => document.activeElement?.textContent), 'Devices');
  assert.equal(await page.locator('#announcer').textContent(), 'Devices loaded');
  await main.getByRole('heading', { name: 'Presence' }).waitFor();

  // An observation waits for its record; the user goes on to Exports.
  await navigateAwayDuringLoad(page, {
    held: /\/observations\/obs_001$/, from: '#/observations/obs_001', to: '#/exports',
  });
  assert.deepEqual(await main.locator('h1').allTextContents(), ['Exports']);
  assert.equal(await main.getByRole('heading', { name: 'Observation obs_001' }).count(), 0);
  assert.equal(await main.getByRole('heading', { name: 'History' }).count(), 0);
  assert.equal(await page.title(), 'Exports · Synkronus');

  // The page that is on screen still works: going back shows the observation whole.
  await go(page, '#/observations/obs_001');
  await main.getByRole('heading', { name: 'Observation obs_001' }).waitFor();
  await main.getByRole('heading', { name: 'History' }).waitFor();
  assert.deepEqual(await main.locator('h1').allTextContents(), ['Observations']);
});

test('the overview chart keeps whole axis labels at ten million observations', async () => {
  // The server's own answer, with every count scaled up to millions: seeding ten million records
  // through the API would take minutes, and the chart only sees these numbers.
  const real = (await api('GET', 'stats/observations')).data;
  const scale = (n) => n * 1_234_567 + 1_600_000;
  const buckets = real.timeline.buckets.map((b) => ({ ...b, count: scale(b.count) }));
  const byFormType = [...real.byFormType.map((t) => ({ ...t, count: scale(t.count) })),
    { formType: 'a_form_type_with_a_rather_long_name', count: 12_345_678 }];
  const total = byFormType.reduce((a, t) => a + t.count, 0);
  const body = { ...real, totalCount: total, byFormType, timeline: { ...real.timeline, buckets } };

  for (const viewport of [{ width: 1280, height: 900 }, { width: 375, height: 812 }]) {
    const page = await newPage(viewport);
    await page.route('**/stats/observations', (route) =>
      route.fulfill({ status: 200, contentType: 'application/json', body: JSON.stringify(body) }));
    await signIn(page);
    await page.getByText(`${total.toLocaleString('en-US')} observations (not deleted)`).waitFor();
    await page.locator('svg.chart').nth(1).waitFor();
    // Every label lies inside its chart's drawing area.
    const outside = await page.evaluate(() => [...document.querySelectorAll('svg.chart')].flatMap((svg) => {
      const width = svg.viewBox.baseVal.width;
      return [...svg.querySelectorAll('text')]
        .map((t) => ({ text: t.textContent, box: t.getBBox() }))
        .filter(({ box }) => box.x < 0 || box.x + box.width > width)
        .map(({ text, box }) => `${text}: ${box.x.toFixed(1)}..${(box.x + box.width).toFixed(1)} of ${width}`);
    }));
    assert.deepEqual(outside, []);
    const ticks = await page.locator('svg.chart').first().locator('text').allTextContents();
    assert.ok(ticks.some((t) => /^\d{1,2},\d{3},\d{3}$/.test(t)), ticks.join(' | '));
    await shot(page, viewport.width < 500 ? 'overview-large-counts-mobile' : 'overview-large-counts');
  }
});

/** A free TCP port on the loopback interface. */
function freePort() {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

/**
 * A second server on its own embedded database, started as an operator would on a first run:
 * no ADMIN_USERNAME or ADMIN_PASSWORD, so the initial admin is admin/admin.
 */
async function startFreshServer() {
  const bin = process.env.SYNKRONUS_BIN;
  if (!bin) throw new Error('run these tests through portal-tests/run.sh');
  // Under /tmp and readable by others: as root, the embedded cluster runs as the postgres user.
  const data = await mkdtemp('/tmp/synkronus-portal-fresh-');
  await chmod(data, 0o755);
  const port = await freePort();
  const env = { ...process.env, DATA_ROOT: data, PORT: String(port), BIND_ADDRESS: '127.0.0.1',
    JWT_SECRET: randomBytes(32).toString('hex'), LOG_LEVEL: 'warn', RATE_LIMIT_LOGIN_PER_MIN: '0' };
  delete env.ADMIN_USERNAME;
  delete env.ADMIN_PASSWORD;
  const child = spawn(bin, ['serve'], { env, stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  for (const stream of [child.stdout, child.stderr]) {
    stream.on('data', (chunk) => {
      log += chunk;
    });
  }
  const exited = new Promise((resolve) => child.on('exit', resolve));
  const base = `http://127.0.0.1:${port}`;
  const stop = async () => {
    if (child.exitCode === null) child.kill('SIGTERM');
    await exited;
    await rm(data, { recursive: true, force: true });
  };
  for (let i = 0; ; i += 1) {
    try {
      if ((await fetch(`${base}/ready`)).ok) break;
    } catch {
      // Not listening yet.
    }
    if (child.exitCode !== null || i > 240) {
      await stop();
      throw new Error(`the second server did not start:\n${log}`);
    }
    await new Promise((r) => setTimeout(r, 250));
  }
  return { base, stop, log: () => log };
}

test('an admin still on the shipped password is asked on every page to change it', async () => {
  const fresh = await startFreshServer();
  let page;
  try {
    page = await newPage(undefined, fresh.base);
    const banner = page.locator('#default-password');
    await page.goto(`${fresh.base}/portal/`);
    await page.getByLabel('User name').fill('admin');
    await page.getByLabel('Password').fill('admin');
    await page.getByRole('button', { name: 'Sign in' }).click();
    await banner.waitFor();
    assert.match(await banner.textContent(), /still has the default password/);
    await page.locator('#observation-count').waitFor();
    // An empty repository: the overview says so, and shows nothing it has no data for.
    await page.getByText('No observations yet.').waitFor();
    assert.equal(await page.locator('#main').getByText('null', { exact: true }).count(), 0);
    await shot(page, 'default-password');

    // It stays above every page, and its link leads to the password change.
    await go(page, '#/users');
    await banner.waitFor();
    await banner.getByRole('link', { name: 'choose a new password in My account' }).click();
    await page.waitForFunction(() => location.hash === '#/account');
    await page.getByRole('heading', { name: 'Change password' }).waitFor();
    await page.getByLabel('Current password').fill('admin');
    await page.getByLabel('New password').fill('a-much-better-password-42');
    await page.getByRole('button', { name: 'Change password' }).click();

    // The change ends the session; signed in with the new password, the banner is gone.
    await page.getByRole('heading', { name: 'Sign in' }).waitFor();
    assert.equal(await banner.count(), 0);
    await page.getByLabel('User name').fill('admin');
    await page.getByLabel('Password').fill('a-much-better-password-42');
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('button', { name: 'Sign out' }).waitFor();
    await go(page, '#/overview');
    await page.locator('#observation-count').waitFor();
    const me = await page.evaluate(async () => {
      const { token } = JSON.parse(sessionStorage.getItem('synkronus.portal.session'));
      const res = await fetch('../auth/me', { headers: { Authorization: `Bearer ${token}` } });
      return (await res.json()).data;
    });
    assert.equal(me.default_password, false);
    assert.equal(await banner.count(), 0);

    // The server said so once, at its start, not at each of these sign-ins.
    assert.equal(fresh.log().match(/default password/g)?.length, 1, fresh.log());
  } finally {
    // Closed before its server stops: the overview it shows refreshes every 15 s, and a refused
    // connection would be reported as an error of whichever test runs then.
    if (page) await page.context().close();
    await fresh.stop();
  }
});

test('an admin with a password of their own sees no banner', async () => {
  const page = await newPage();
  const checked = page.waitForResponse((res) => new URL(res.url()).pathname.endsWith('/auth/me'));
  await signIn(page);
  await page.locator('#observation-count').waitFor();
  // The banner depends on GET /auth/me: wait for that answer and for the portal to have read it
  // (#notices is busy until then), not for a fixed time.
  assert.equal((await checked).status(), 200);
  await page.locator('#notices:not([aria-busy])').waitFor({ state: 'attached' });
  assert.equal(await page.locator('#default-password').count(), 0);
});

test('audit log: filter by action and user, page to older entries, admins only', async () => {
  // Something worth auditing: failed sign-ins, a user created and demoted.
  for (const password of ['guess-1', 'guess-2']) {
    const res = await api('POST', 'auth/login', { token: null, json: { username: 'intruder', password } });
    assert.equal(res.status, 401);
  }
  const created = await api('POST', 'users', {
    json: { username: 'audit-reader', password: 'audit-reader-pass', role: 'read-write' },
  });
  assert.equal(created.status, 201, JSON.stringify(created.data));
  assert.equal((await api('PUT', 'users/audit-reader', { json: { role: 'read-only' } })).status, 200);

  const page = await newPage();
  await signIn(page);
  await go(page, '#/audit');
  await page.locator('tbody tr', { hasText: 'user.role_change' }).first().waitFor();
  await page.screenshot({ path: path.join(shots, 'audit.png') });
  await page.getByLabel('Action').selectOption('auth.sign_in_failed');
  await page.getByRole('button', { name: 'Search' }).click();
  // The unfiltered list already shows the intruder's rows: wait for the search's answer itself,
  // a table of failed sign-ins only, not for rows the previous list may still be showing.
  await page.waitForFunction(() => {
    const cells = [...document.querySelectorAll('tbody td[data-label="Action"]')];
    return cells.length >= 2 && cells.every((cell) => cell.textContent === 'auth.sign_in_failed');
  });
  const actions = await page.locator('tbody td[data-label="Action"]').allTextContents();
  assert.ok(actions.length >= 2 && actions.every((a) => a === 'auth.sign_in_failed'), actions.join());
  assert.match(await page.locator('tbody tr').first().textContent(), /127\.0\.0\.1.*reason: unknown user/);

  // More than a page (50) of one kind: the rest comes with "Older entries".
  for (let i = 0; i < 55; i += 1) {
    const spec = { formType: 'audit_demo', version: `v${i}`, schema: { type: 'object' }, uischema: { type: 'VerticalLayout', elements: [] } };
    assert.equal((await api('POST', 'formspecs', { json: spec })).status, 201);
  }
  await page.getByLabel('Action').selectOption('formspec.change');
  await page.getByLabel('User name').fill('admin');
  await page.getByRole('button', { name: 'Search' }).click();
  await page.getByText('50 entries so far.').waitFor();
  assert.equal(await page.locator('tbody tr').first().locator('td[data-label="Details"]').textContent(), 'version: v54');
  await page.getByRole('button', { name: 'Older entries' }).click();
  await page.getByText('55 entries.').waitFor();
  assert.equal(await page.getByRole('button', { name: 'Older entries' }).isVisible(), false);

  // A filter the server refuses shows its message, and read-only users have no Audit page.
  await page.getByLabel('User name').fill('');
  await page.getByLabel('Action').selectOption('');
  await page.getByLabel('From').fill('2030-01-02T00:00');
  await page.getByLabel('Until').fill('2030-01-01T00:00');
  await page.getByRole('button', { name: 'Search' }).click();
  await page.getByRole('alert').getByText("'since' is after 'until'").first().waitFor();

  const reader = await newPage();
  await signIn(reader, 'audit-reader', 'audit-reader-pass');
  const nav = await reader.getByRole('navigation', { name: 'Main' }).textContent();
  assert.ok(!nav.includes('Audit'), nav);
  await go(reader, '#/audit');
  await reader.getByText('This page is for admins.').waitFor();
});

test('users: set a user\'s attributes, with the API\'s messages next to the attribute they name', async () => {
  const created = await api('POST', 'users', {
    json: { username: 'worker-north', password: 'worker-north-pass', role: 'read-write' },
  });
  assert.equal(created.status, 201, JSON.stringify(created.data));
  const page = await newPage();
  await signIn(page);
  await go(page, '#/users');
  const row = page.locator('tbody tr', { hasText: 'worker-north' });
  await row.getByText('none').waitFor();
  await page.getByRole('button', { name: 'Edit the attributes of worker-north' }).click();
  const dialog = page.getByRole('dialog', { name: 'Attributes of worker-north' });
  const rows = dialog.locator('fieldset.attribute-row');
  await rows.nth(0).getByLabel('Name').fill('district');
  await rows.nth(0).getByLabel('Values').fill('north\n\nnorth-east');
  await dialog.getByRole('button', { name: 'Add an attribute' }).click();
  await rows.nth(1).getByLabel('Name').fill('bad name!');
  await rows.nth(1).getByLabel('Values').fill('t7');
  await dialog.getByRole('button', { name: 'Save attributes' }).click();

  // The server's message sits next to the attribute it names, and nothing was saved.
  const problem = rows.nth(1).locator('.field-error');
  await problem.waitFor();
  assert.match(await problem.textContent(), /attribute name 'bad name!' must be 1 to 64 characters/);
  assert.equal(await rows.nth(1).getByLabel('Name').getAttribute('aria-invalid'), 'true');
  assert.equal(await rows.nth(0).locator('.field-error').count(), 0);
  await dialog.getByRole('alert').getByText('BAD_REQUEST').waitFor();
  assert.deepEqual((await api('GET', 'users/worker-north')).data.attributes, {});
  await shot(page, 'user-attributes');

  // Fixed, it saves, and the list shows the attributes.
  await rows.nth(1).getByLabel('Name').fill('team');
  await dialog.getByRole('button', { name: 'Save attributes' }).click();
  await dialog.waitFor({ state: 'detached' });
  await page.locator('#main').getByText('Attributes of worker-north saved.').waitFor();
  await row.locator('.attribute-list').getByText('north, north-east').waitFor();
  assert.deepEqual((await api('GET', 'users/worker-north')).data.attributes,
    { district: ['north', 'north-east'], team: ['t7'] });

  // Back to one district, from the same dialog.
  await page.getByRole('button', { name: 'Edit the attributes of worker-north' }).click();
  await rows.nth(0).getByLabel('Values').fill('north');
  await dialog.getByRole('button', { name: 'Save attributes' }).click();
  await dialog.waitFor({ state: 'detached' });
  await row.locator('.attribute-list dd', { hasText: /^north$/ }).waitFor();

  // The audit log reads the change as attributes.
  await go(page, '#/audit');
  await page.getByLabel('Action').selectOption('user.attributes_change');
  await page.getByRole('button', { name: 'Search' }).click();
  await page.locator('tbody td[data-label="Details"]', { hasText: 'to: {district: north; team: t7}' }).waitFor();

  // From the Users page to what the user receives.
  await go(page, '#/users');
  await page.getByRole('link', { name: 'What worker-north receives' }).click();
  await page.locator('#preview-result').getByText('attributes: district: north; team: t7').waitFor();
  await page.locator('#preview-result').getByText('Receives every record.').waitFor();
});

/** Removes any scope set through the API and waits until nothing is being prepared. */
async function noScopeSet() {
  await api('DELETE', 'admin/scopes');
  for (let i = 0; ; i += 1) {
    const status = (await api('GET', 'admin/scopes/status')).data;
    if (status.preparing_version === null) return;
    assert.ok(i < 300, JSON.stringify(status));
    await new Promise((r) => setTimeout(r, 100));
  }
}

test('scopes: a set with a problem shown next to its field, then fixed, prepared, in force, previewed and removed', async () => {
  const push = await api('POST', 'sync/push', {
    json: {
      transmission_id: 'portal-scopes-1',
      client_id: 'tablet-portal-08',
      records: [
        ['hh-north-1', 'household', { district: 'north', head_name: 'Kofi' }],
        ['hh-east-1', 'household', { district: 'east', head_name: 'Ama' }],
        ['facility-1', 'facility', { name: 'North clinic' }],
      ].map(([id, formType, data]) => ({
        observation_id: id, form_type: formType, form_version: '1.0', data,
        created_at: '2026-02-01T08:00:00Z', updated_at: '2026-02-01T08:00:00Z', deleted: false,
      })),
    },
  });
  assert.equal(push.status, 200, JSON.stringify(push.data));
  if (JSON.stringify((await api('GET', 'users/worker-north')).data.attributes) !== '{"district":["north"],"team":["t7"]}') {
    await api('POST', 'users', { json: { username: 'worker-north', password: 'worker-north-pass', role: 'read-write' } });
    const set = await api('PUT', 'users/worker-north', { json: { attributes: { district: ['north'], team: ['t7'] } } });
    assert.equal(set.status, 200, JSON.stringify(set.data));
  }
  await noScopeSet();
  try {
    const page = await newPage();
    await signIn(page);
    await go(page, '#/scopes');
    await page.locator('#scope-in-force').getByText('No scope set: every signed-in user receives every record.').waitFor();
    assert.equal(await page.locator('#scope-version').textContent(), 'none');
    assert.equal(await page.locator('#scope-remove').isVisible(), false);

    // Before: what the worker receives with no set.
    await page.getByLabel('User', { exact: true }).selectOption('worker-north');
    await page.getByRole('button', { name: 'Preview' }).click();
    await page.locator('#preview-result').getByText('Receives every record.').waitFor();

    // Two rules; the first with a path the server refuses.
    await page.getByRole('button', { name: 'Add a rule' }).click();
    const first = page.locator('fieldset.rule-editor').nth(0);
    await first.getByLabel('Rule name').fill('workers: their district\'s households');
    assert.ok(await first.getByLabel('read-write').isChecked());
    await first.getByLabel('Only these:').check();
    await first.getByLabel('Form types, comma-separated').fill('household');
    await first.getByLabel('Which records').selectOption('attribute');
    await first.getByLabel('Data field').fill('address..district');
    await first.getByLabel('User attribute').fill('district');
    await page.getByRole('button', { name: 'Add a rule' }).click();
    const second = page.locator('fieldset.rule-editor').nth(1);
    await second.getByLabel('Rule name').fill('everyone: facilities');
    await second.getByLabel('Only these:').check();
    await second.getByLabel('Form types, comma-separated').fill('facility');
    await page.getByRole('button', { name: 'Save the rules' }).click();

    const problem = first.locator('[data-part="field"] .field-error');
    await problem.waitFor();
    assert.match(await problem.textContent(), /bad path 'address\.\.district'/);
    assert.equal(await first.getByLabel('Data field').getAttribute('aria-invalid'), 'true');
    assert.equal(await second.locator('.field-error').count(), 0);
    const listed = await page.locator('#scope-problems .problems li').allTextContents();
    assert.deepEqual(listed.map((p) => p.split(':')[0]), ['/rules/0/where/field'], listed.join('\n'));
    // Focus went to the field to fix.
    assert.equal(await first.getByLabel('Data field').evaluate((el) => el === document.activeElement), true);
    assert.equal((await api('GET', 'admin/scopes')).data.version, 0);
    await shot(page, 'scopes-invalid');

    // The JSON view holds the same rules, and comes back to the form unchanged.
    await page.getByRole('button', { name: 'JSON', exact: true }).click();
    const json = JSON.parse(await page.getByLabel('The rules as JSON').inputValue());
    assert.equal(json.rules.length, 2);
    assert.deepEqual(json.rules[1], { name: 'everyone: facilities', applies_to: { roles: ['read-only', 'read-write'] }, form_types: ['facility'] });
    await page.getByRole('button', { name: 'Form', exact: true }).click();
    assert.equal(await first.getByLabel('Data field').inputValue(), 'address..district');

    // Fixed and saved: the first status answer is held at 42 % so the bar can be seen, then the
    // server's own answers follow until the version is in force.
    let calls = 0;
    let release;
    const held = new Promise((resolve) => {
      release = resolve;
    });
    await page.route('**/admin/scopes/status', async (route) => {
      calls += 1;
      if (calls > 1) {
        await held;
        await route.continue();
        return;
      }
      const real = await (await route.fetch()).json();
      const version = real.preparing_version ?? real.active_version;
      await route.fulfill({
        json: { active_version: 0, preparing_version: version, progress: 0.42, scanned: 42, to_scan: 100 },
      });
    });
    await first.getByLabel('Data field').fill('district');
    await page.getByRole('button', { name: 'Save the rules' }).click();
    const saved = await page.locator('#scope-saved').getByText(/^Saved as version \d+/).textContent();
    const version = Number(/version (\d+)/.exec(saved)[1]);
    await page.locator('.progress-text').getByText('42 %: 42 of 100 records scanned').waitFor();
    assert.equal(await page.locator('.progress progress').evaluate((p) => p.value), 0.42);
    assert.match(await page.locator('#scope-status').textContent(), new RegExp(`Version ${version} is being prepared`));
    release();
    await page.locator('#scope-status').getByText(`Version ${version} is in force.`).waitFor();
    await page.unroute('**/admin/scopes/status');
    await page.locator('#scope-version').getByText(String(version), { exact: true }).waitFor();
    assert.equal(await page.locator('.progress').isVisible(), false);
    assert.deepEqual(await page.locator('#scope-in-force .rule h3').allTextContents(),
      ['workers: their district\'s households', 'everyone: facilities']);
    await page.locator('#scope-in-force .rule').first().getByText('is one of the user\'s').waitFor();

    // After: the preview follows by itself, under the version now in force.
    const result = page.locator('#preview-result');
    await result.getByText(`In force: version ${version}`).waitFor();
    await result.getByText('2 records').waitFor();
    const counts = await result.locator('tbody tr').allTextContents();
    assert.deepEqual(counts, ['facility1', 'household1']);
    assert.match(await result.locator('.rule-names').textContent(), /workers: their district's households, everyone: facilities/);
    assert.deepEqual((await api('GET', 'admin/scopes')).data.rules[0].where, { field: 'district', in_attribute: 'district' });
    await shot(page, 'scopes');

    // The worker's overview says why it shows no repository-wide counts, instead of an error.
    const worker = await newPage();
    await signIn(worker, 'worker-north', 'worker-north-pass');
    await worker.locator('#scoped-counts').waitFor();
    assert.match(await worker.locator('#observation-count').textContent(), /admins only while a scope set is in force/);
    assert.equal(await worker.locator('#main .error').count(), 0);
    await worker.context().close();

    // The rules, the editor and the users' attributes fit a phone's width.
    const phone = await newPage({ width: 375, height: 812 });
    await signIn(phone);
    for (const hash of ['#/scopes/worker-north', '#/users']) {
      await go(phone, hash);
      const width = await phone.evaluate(() => document.documentElement.scrollWidth);
      assert.ok(width <= 375, `${hash} is ${width}px wide at 375px`);
    }
    await phone.context().close();

    // A set with no rule asks first; cancelling stores nothing.
    await page.getByRole('button', { name: 'JSON', exact: true }).click();
    await page.getByLabel('The rules as JSON').fill('{"rules": []}');
    await page.getByRole('button', { name: 'Save the rules' }).click();
    await page.getByRole('dialog').getByRole('button', { name: 'Cancel' }).click();
    assert.equal((await api('GET', 'admin/scopes/status')).data.preparing_version, null);
    assert.equal((await api('GET', 'admin/scopes')).data.version, version);
    await page.getByRole('button', { name: 'Discard changes' }).click();
    await page.waitForFunction(() => JSON.parse(document.getElementById('scope-json').value).rules.length === 2);

    // Removal, with a confirmation.
    await page.locator('#scope-remove').click();
    await page.getByRole('dialog').getByRole('button', { name: 'Remove the scope set' }).click();
    await page.locator('#main').getByText(/The removal is stored as version \d+/).waitFor();
    await page.locator('#scope-status').getByText('No scope set is in force.').waitFor();
    await page.locator('#scope-version').getByText('none').waitFor();
    assert.equal((await api('GET', 'admin/scopes')).data.rules, null);
    await result.getByText('Receives every record.').waitFor();
  } finally {
    await noScopeSet();
  }
});
