// Observations (docs/api.md §12): filter by form type and time, look up by id, a record's JSON, its
// history, and its attachments (images previewed, other files downloadable).
import * as api from './api.js';
import {
  h, section, table, timeEl, field, showError, button, busy, badge, saveBlob, fmtBytes, errorBox,
} from './ui.js';

const FILE_EXT = /\.(jpe?g|png|gif|webp|heic|pdf|mp3|m4a|aac|wav|ogg|mp4|mov|webm|3gp|txt|csv|zip)$/i;

const toIsoStart = (v) => (v ? new Date(`${v}T00:00:00`).getTime() : null);
const toIsoEnd = (v) => (v ? new Date(`${v}T23:59:59.999`).getTime() : null);

export async function render(main) {
  const admin = api.isAdmin();
  const lookup = h('input', { id: 'lookup-id', autocomplete: 'off', required: true, placeholder: 'obs_001' });
  const lookupForm = h(
    'form',
    {
      class: 'filters',
      onsubmit: (e) => {
        e.preventDefault();
        location.hash = `#/observations/${encodeURIComponent(lookup.value.trim())}`;
      },
    },
    field('Observation id', lookup).wrap,
    h('button', { class: 'primary' }, 'Open'),
  );

  const formType = h('input', { id: 'filter-form-type', list: 'form-types', autocomplete: 'off' });
  const types = h('datalist', { id: 'form-types' });
  const from = h('input', { type: 'date', id: 'filter-from' });
  const to = h('input', { type: 'date', id: 'filter-to' });
  const deleted = h('input', { type: 'checkbox', id: 'filter-deleted' });
  const scope = h(
    'select',
    { id: 'filter-scope' },
    admin ? h('option', { value: 'all' }, 'Everybody') : null,
    h('option', { value: 'mine' }, 'Mine only'),
  );
  const slot = h('div');
  const results = h('div');
  const more = button('Load more', () => loadPage(), 'secondary');
  more.hidden = true;
  const submit = h('button', { class: 'primary' }, 'Search');
  const filterForm = h(
    'form',
    {
      class: 'filters',
      onsubmit: (e) => {
        e.preventDefault();
        start();
      },
    },
    field('Form type', formType, 'Empty: every form type.').wrap,
    field('Created from', from).wrap,
    field('Created until', to).wrap,
    admin ? field('Pushed by', scope).wrap : null,
    h('div', { class: 'field check' }, deleted, h('label', { for: 'filter-deleted' }, 'Include deleted')),
    submit,
    types,
  );
  main.append(
    section('Look up an observation', lookupForm),
    section('Browse observations', filterForm, admin ? null : h('p', { class: 'hint' }, 'You see the records you pushed.'), slot, results, more),
  );

  api.get('stats/observations').then((s) => {
    types.replaceChildren(...s.byFormType.filter((f) => f.formType !== '(no form type)').map((f) => h('option', { value: f.formType })));
  }).catch(() => {});

  let rows = [];
  let token = null;
  // A search started while pages are still loading (Enter in a field during the first load)
  // replaces that load: its later answers are dropped instead of mixed into the new list.
  let search = 0;

  function start() {
    search += 1;
    rows = [];
    token = null;
    loadPage();
  }

  async function loadPage() {
    const mine = search;
    await busy(more.hidden ? submit : more, slot, async () => {
      const lo = toIsoStart(from.value);
      const hi = toIsoEnd(to.value);
      // The API filters by form type; the time window is applied here, reading up to 10 pages per click.
      let matched = 0;
      for (let pages = 0; pages < 10; pages += 1) {
        const page = await api.get('observations', {
          form_type: formType.value.trim(),
          include_deleted: deleted.checked ? 'true' : '',
          all: admin && scope.value === 'all' ? 'true' : '',
          limit: 200,
          page_token: token,
        });
        if (mine !== search) return;
        const keep = page.observations.filter((o) => {
          const t = new Date(o.created_at).getTime();
          return (lo === null || t >= lo) && (hi === null || t <= hi);
        });
        rows.push(...keep);
        matched += keep.length;
        token = page.has_more ? page.next_page_token : null;
        if (!token || matched >= 50) break;
      }
      more.hidden = !token;
      draw();
    });
  }

  function draw() {
    results.replaceChildren(
      h('p', { 'aria-live': 'polite' }, `${rows.length} observations${token ? ' so far' : ''}.`),
      table(
        'Observations, oldest change first',
        [
          { label: 'Id', cell: (o) => h('a', { href: `#/observations/${encodeURIComponent(o.observation_id)}` }, o.observation_id) },
          { label: 'Form', cell: (o) => `${o.form_type || '(none)'} ${o.form_version}` },
          { label: 'Created', cell: (o) => timeEl(o.created_at) },
          { label: 'Synced', cell: (o) => timeEl(o.synced_at) },
          { label: 'By', cell: (o) => o.created_by || '—' },
          { label: 'Change', cell: (o) => [String(o.version), o.deleted ? [' ', badge('deleted', 'warn')] : ''], class: 'num' },
        ],
        rows,
        { empty: 'No observation matches.' },
      ),
    );
  }
  start();
}

/** Attachment ids referenced from record data: {type, id, filename} objects and file-like strings. */
export function attachmentRefs(data) {
  const found = new Set();
  const walk = (v) => {
    if (Array.isArray(v)) v.forEach(walk);
    else if (v && typeof v === 'object') {
      if (typeof v.filename === 'string' && v.filename) found.add(v.filename);
      else if (typeof v.id === 'string' && typeof v.type === 'string' && /image|audio|video|file|signature|photo/i.test(v.type)) {
        found.add(v.id);
      }
      Object.values(v).forEach(walk);
    } else if (typeof v === 'string' && FILE_EXT.test(v) && v.length <= 255 && !v.includes('/')) {
      found.add(v);
    }
  };
  walk(data);
  return [...found];
}

export async function renderOne(main, id) {
  const slot = h('div');
  main.append(h('p', {}, h('a', { href: '#/observations' }, '← All observations')), slot);
  let record;
  try {
    record = await api.get(`observations/${encodeURIComponent(id)}`);
  } catch (err) {
    slot.replaceChildren(errorBox(err));
    return;
  }
  const meta = [
    ['Form type', record.form_type || '(none)'],
    ['Form version', record.form_version || '—'],
    ['Created (device)', timeEl(record.created_at)],
    ['Updated (device)', timeEl(record.updated_at)],
    ['Synced', timeEl(record.synced_at)],
    ['Change id', String(record.version)],
    ['Pushed by', record.created_by || '—'],
    ['Deleted', record.deleted ? badge('deleted', 'warn') : 'no'],
  ];
  const historyBox = h('div', { id: 'history' });
  const attachBox = h('div', { id: 'attachments' });
  main.append(
    section(
      `Observation ${record.observation_id}`,
      h('dl', { class: 'stats' }, meta.map(([k, v]) => h('div', { class: 'stat' }, h('dt', {}, k), h('dd', {}, v)))),
      h('h3', {}, 'Record JSON'),
      h('pre', { class: 'code', id: 'record-json', tabindex: '0' }, JSON.stringify(record, null, 2)),
      button('Download JSON', () =>
        saveBlob(new Blob([JSON.stringify(record, null, 2)], { type: 'application/json' }), `${record.observation_id}.json`)),
    ),
    section('History', historyBox),
    section('Attachments', attachBox),
  );
  await Promise.all([history(historyBox, id), attachments(attachBox, attachmentRefs(record.data))]);
}

async function history(box, id) {
  const revisions = [];
  let token = null;
  const more = button('Older revisions', () => load(), 'secondary');
  const slot = h('div');
  const list = h('div');
  box.append(slot, list, more);
  async function load() {
    await busy(more, slot, async () => {
      const page = await api.get(`observations/${encodeURIComponent(id)}/history`, { limit: 50, page_token: token });
      revisions.push(...page.revisions);
      token = page.has_more ? page.next_page_token : null;
      more.hidden = !token;
      list.replaceChildren(
        table(
          `${revisions.length} revisions, newest first`,
          [
            { label: 'Change', cell: (r) => String(r.version), class: 'num' },
            { label: 'Synced', cell: (r) => timeEl(r.synced_at) },
            { label: 'Pushed by', cell: (r) => r.pushed_by || '—' },
            { label: 'Client', cell: (r) => r.client_id || '—' },
            {
              label: 'State',
              cell: (r) => [
                r.deleted ? badge('deleted', 'warn') : badge('saved', 'ok'),
                r.conflict ? [' ', badge('overwrote a newer change', 'warn')] : '',
                r.overwrote_version ? ` replaced ${r.overwrote_version}` : ' first revision',
              ],
            },
            {
              label: 'Data',
              cell: (r) => h('details', {}, h('summary', {}, 'Show'), h('pre', { class: 'code' }, JSON.stringify(r.data, null, 2))),
            },
          ],
          revisions,
          { rowClass: () => 'revision' },
        ),
      );
    });
  }
  await load();
}

async function attachments(box, ids) {
  if (!ids.length) {
    box.append(h('p', { class: 'empty' }, 'This record references no attachment.'));
    return;
  }
  const grid = h('ul', { class: 'attachments' });
  box.append(grid);
  for (const id of ids) {
    const item = h('li', {}, h('code', {}, id));
    const problem = h('div');
    grid.append(item);
    try {
      const res = await api.head(`attachments/${encodeURIComponent(id)}`);
      const type = res.headers.get('content-type') || '';
      const size = Number(res.headers.get('content-length'));
      const save = button(`Download ${id}`, async () => {
        await busy(save, problem, async () => {
          const { blob, filename } = await api.download(`attachments/${encodeURIComponent(id)}`, null, null, id);
          saveBlob(blob, filename);
        });
      }, 'secondary small');
      item.append(h('p', { class: 'hint' }, `${type}, ${fmtBytes(size)}`));
      if (type.startsWith('image/')) {
        const { blob } = await api.download(`attachments/${encodeURIComponent(id)}`, { quality: 'small' });
        item.prepend(h('img', { src: URL.createObjectURL(blob), alt: `Attachment ${id}`, class: 'thumb' }));
      }
      item.append(save, problem);
    } catch (err) {
      item.append(err.status === 404 ? h('p', { class: 'hint' }, 'Not uploaded yet.') : errorBox(err));
    }
  }
}
