// App bundles (docs/api.md §9, §17.6): the active manifest, versions, upload with progress and every
// validation problem, the changes between two versions, switch / roll back, and a file browser.
import * as api from './api.js';
import {
  h, section, table, timeEl, field, showError, success, button, busy, confirmDialog, progress, fmtBytes, badge,
  saveBlob, announce,
} from './ui.js';

const byPath = (a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0);

async function activeManifest() {
  try {
    return await api.get('app-bundle/manifest');
  } catch (err) {
    if (err.status === 404) return null;
    throw err;
  }
}

export async function render(main) {
  const admin = api.isAdmin();
  const slot = h('div', { 'aria-live': 'polite' });
  const manifestBox = h('div', { id: 'active-manifest' });
  const versionsBox = h('div');
  const compareBox = h('div');
  main.append(slot, section('Active version', manifestBox));
  if (admin) main.append(uploadSection(() => load()));
  main.append(section('Versions', versionsBox), section('Compare two versions', compareBox));

  async function switchTo(v, rollback, btn) {
    const ok = await confirmDialog(
      rollback ? `Roll back to ${v.version}?` : `Switch to ${v.version}?`,
      'Devices download the active version on their next sync. The switch is atomic: a device sees either the old or the new version, never a mix.',
      rollback ? 'Roll back' : 'Switch',
    );
    if (!ok) return;
    await busy(btn, slot, async () => {
      const res = await api.post(`app-bundle/switch/${encodeURIComponent(v.version)}`);
      const warnings = (res.warnings || []).map((w) => w.message).join(' ');
      success(slot, `${res.message}.${warnings ? ` Warnings: ${warnings}` : ''}`);
      announce(res.message);
      await load();
    });
  }

  async function load() {
    try {
      const [manifest, list] = await Promise.all([activeManifest(), api.get('app-bundle/versions')]);
      const versions = list.versions || [];
      manifestBox.replaceChildren(
        manifest
          ? h(
            'dl',
            { class: 'stats' },
            h('div', { class: 'stat' }, h('dt', {}, 'Version'), h('dd', { id: 'manifest-version' }, manifest.version)),
            h('div', { class: 'stat' }, h('dt', {}, 'Name'), h('dd', {}, manifest.name)),
            h('div', { class: 'stat' }, h('dt', {}, 'Entry point'), h('dd', {}, h('code', {}, manifest.entryPoint))),
            h('div', { class: 'stat' }, h('dt', {}, 'Files'), h('dd', { id: 'manifest-files' },
              `${manifest.files.length} (${fmtBytes(manifest.files.reduce((a, f) => a + f.size, 0))})`)),
            h('div', { class: 'stat wide' }, h('dt', {}, 'Manifest hash'), h('dd', {}, h('code', { class: 'hash' }, manifest.hash))),
          )
          : h('p', { class: 'empty', id: 'manifest-version' }, 'No version is active: devices cannot fetch an app yet.'),
        manifest ? h('p', {}, h('a', { href: `#/bundles/${encodeURIComponent(manifest.version)}` }, 'Browse the active files')) : '',
      );
      const active = versions.find((v) => v.active);
      const activeIndex = versions.indexOf(active);
      versionsBox.replaceChildren(
        table(
          'Uploaded versions, newest first',
          [
            { label: 'Version', cell: (v) => [h('code', {}, v.version), v.active ? [' ', badge('active', 'ok')] : ''] },
            { label: 'Name', cell: (v) => v.name || '—' },
            { label: 'Uploaded', cell: (v) => timeEl(v.created_at) },
            {
              label: 'Actions',
              cell: (v) => {
                const files = h('a', { href: `#/bundles/${encodeURIComponent(v.version)}`, class: 'button secondary small' }, 'Files');
                if (!admin || v.active) return h('div', { class: 'inline' }, files);
                // Versions are listed newest first: one listed after the active one is older.
                const rollback = active && versions.indexOf(v) > activeIndex;
                const btn = button(rollback ? 'Roll back' : 'Switch', () => switchTo(v, rollback, btn), 'primary small', {
                  'aria-label': `${rollback ? 'Roll back' : 'Switch'} to ${v.version}`,
                });
                return h('div', { class: 'inline' }, files, btn);
              },
            },
          ],
          versions,
          { rowClass: (v) => (v.active ? 'active' : null), empty: 'No bundle has been uploaded yet.' },
        ),
      );
      compareBox.replaceChildren(compareForm(versions, active));
    } catch (err) {
      showError(slot, err);
    }
  }
  await load();
}

function uploadSection(reload) {
  const input = h('input', { type: 'file', id: 'bundle-file', accept: '.zip,application/zip' });
  const activate = h('input', { type: 'checkbox', id: 'bundle-activate' });
  const chosen = h('p', { class: 'chosen', 'aria-live': 'polite' }, 'No file chosen.');
  const bar = progress('Upload progress');
  const slot = h('div', { id: 'upload-result', 'aria-live': 'polite' });
  const submit = h('button', { class: 'primary', disabled: true }, 'Upload');
  let file = null;

  const choose = (f) => {
    file = f || null;
    chosen.textContent = file ? `${file.name} (${fmtBytes(file.size)})` : 'No file chosen.';
    submit.disabled = !file;
  };
  input.addEventListener('change', () => choose(input.files[0]));

  const zone = h(
    'div',
    { class: 'dropzone' },
    h('p', {}, 'Drop a bundle ZIP here, or '),
    h('label', { for: 'bundle-file', class: 'button secondary' }, 'choose a file'),
    input,
    chosen,
  );
  zone.addEventListener('dragover', (e) => {
    e.preventDefault();
    zone.classList.add('over');
  });
  zone.addEventListener('dragleave', () => zone.classList.remove('over'));
  zone.addEventListener('drop', (e) => {
    e.preventDefault();
    zone.classList.remove('over');
    if (e.dataTransfer.files.length) choose(e.dataTransfer.files[0]);
  });

  const form = h(
    'form',
    {
      onsubmit: (e) => {
        e.preventDefault();
        if (!file) return;
        busy(submit, slot, async () => {
          const data = new FormData();
          data.append('bundle', file, file.name);
          bar.set(0, 'Uploading…');
          try {
            const res = await api.upload('app-bundle/push', data, (loaded, total) => {
              if (total && loaded < total) bar.set(loaded / total, `Uploading: ${fmtBytes(loaded)} of ${fmtBytes(total)}`);
              else bar.set(null, 'Validating on the server…');
            }, { activate: activate.checked ? 'true' : '' });
            bar.set(1, 'Done.');
            const warnings = (res.warnings || []).map((w) => h('li', {}, w.message));
            slot.replaceChildren(
              h('div', { class: 'ok', role: 'status' },
                h('p', {}, `Uploaded version `, h('code', {}, res.version), res.active ? ' and made it active.' : ' (not active).'),
                warnings.length ? h('ul', {}, warnings) : ''),
            );
            choose(null);
            input.value = '';
            await reload();
          } catch (err) {
            bar.hide();
            throw err;
          }
        });
      },
    },
    zone,
    h('div', { class: 'field check' }, activate, h('label', { for: 'bundle-activate' }, 'Make it the active version')),
    submit,
    bar.el,
    slot,
  );
  return section('Upload a version', form);
}

function compareForm(versions, active) {
  if (versions.length < 2) return h('p', { class: 'empty' }, 'Two versions are needed for a comparison.');
  const options = (selected) =>
    versions.map((v) => h('option', { value: v.version, selected: v.version === selected }, v.active ? `${v.version} (active)` : v.version));
  // From the active version (else the previous one) to the newest other version.
  const from = (active || versions[1]).version;
  const to = versions.find((v) => v.version !== from).version;
  const current = h('select', { id: 'compare-current' }, options(from));
  const target = h('select', { id: 'compare-target' }, options(to));
  const out = h('div', { id: 'compare-result', 'aria-live': 'polite' });
  const submit = h('button', { class: 'primary' }, 'Compare');
  return h(
    'div',
    {},
    h(
      'form',
      {
        class: 'filters',
        onsubmit: (e) => {
          e.preventDefault();
          busy(submit, out, async () => {
            const c = await api.get('app-bundle/changes', { current: current.value, target: target.value });
            out.replaceChildren(changesView(c));
          });
        },
      },
      field('From', current).wrap,
      field('To', target).wrap,
      submit,
    ),
    out,
  );
}

function changesView(c) {
  const files = (title, items, cls) =>
    h('div', {}, h('h3', {}, `${title} (${items.length})`),
      items.length ? h('ul', { class: `files ${cls}` }, items.map((f) => h('li', {}, h('code', {}, f.path)))) : h('p', { class: 'empty' }, 'None.'));
  const forms = [
    ...c.new_forms.map((f) => h('li', {}, badge('new', 'ok'), ' ', f.form)),
    ...c.removed_forms.map((f) => h('li', {}, badge('removed', 'warn'), ' ', f.form)),
    ...c.modified_forms.map((f) =>
      h('li', {}, badge('changed'), ' ', f.form,
        ` (schema ${f.schema_changed ? 'changed' : 'same'}, UI ${f.ui_changed ? 'changed' : 'same'}${f.core_changed ? ', core fields changed' : ''})`,
        f.added_fields.length || f.removed_fields.length
          ? h('ul', {},
            f.added_fields.map((x) => h('li', {}, `+ ${x.field}: ${x.type ?? 'any'}`)),
            f.removed_fields.map((x) => h('li', {}, `− ${x.field}: ${x.type ?? 'any'}`)))
          : '')),
  ];
  return h(
    'div',
    { class: 'changes' },
    h('p', {}, 'From ', h('code', {}, c.current_version), ' to ', h('code', {}, c.target_version), '.'),
    h('div', { class: 'cols' }, files('Added', c.added, 'added'), files('Modified', c.modified, 'modified'), files('Removed', c.removed, 'removed')),
    h('h3', {}, 'Forms'),
    forms.length ? h('ul', { class: 'forms' }, forms) : h('p', { class: 'empty' }, 'No form changed.'),
  );
}

/** The entries of a ZIP archive, from its central directory (files only, no folders). */
export function zipEntries(buffer) {
  const dv = new DataView(buffer);
  let eocd = -1;
  for (let i = buffer.byteLength - 22; i >= Math.max(0, buffer.byteLength - 65_557); i -= 1) {
    if (dv.getUint32(i, true) === 0x06054b50) {
      eocd = i;
      break;
    }
  }
  if (eocd < 0) throw new Error('The archive is not a readable ZIP');
  let count = dv.getUint16(eocd + 10, true);
  let offset = dv.getUint32(eocd + 16, true);
  const locator = eocd - 20;
  if ((offset === 0xffffffff || count === 0xffff) && locator >= 0 && dv.getUint32(locator, true) === 0x07064b50) {
    const z = Number(dv.getBigUint64(locator + 8, true));
    count = Number(dv.getBigUint64(z + 32, true));
    offset = Number(dv.getBigUint64(z + 48, true));
  }
  const utf8 = new TextDecoder();
  const out = [];
  let p = offset;
  for (let n = 0; n < count && p + 46 <= buffer.byteLength; n += 1) {
    if (dv.getUint32(p, true) !== 0x02014b50) break;
    const size = dv.getUint32(p + 24, true);
    const nameLen = dv.getUint16(p + 28, true);
    const extraLen = dv.getUint16(p + 30, true);
    const commentLen = dv.getUint16(p + 32, true);
    const path = utf8.decode(new Uint8Array(buffer, p + 46, nameLen));
    if (!path.endsWith('/')) out.push({ path, size: size === 0xffffffff ? null : size });
    p += 46 + nameLen + extraLen + commentLen;
  }
  return out.sort(byPath);
}

const TEXT = /^(text\/|application\/(json|javascript|xml))/;

/** #/bundles/{version}: the files of one version, each viewable or downloadable. */
export async function renderFiles(main, version) {
  const slot = h('div');
  const listBox = h('div', {}, h('p', { class: 'empty' }, 'Loading…'));
  const preview = h('div', { id: 'file-preview', 'aria-live': 'polite' });
  main.append(
    h('p', {}, h('a', { href: '#/bundles' }, '← All versions')),
    section(`Files of ${version}`, slot, listBox),
    section('File', preview),
  );
  let files;
  try {
    const manifest = await activeManifest();
    if (manifest && manifest.version === version) {
      files = manifest.files;
    } else {
      const { blob } = await api.download('app-bundle/download-zip', { version });
      files = zipEntries(await blob.arrayBuffer());
    }
  } catch (err) {
    listBox.replaceChildren();
    showError(slot, err);
    return;
  }

  let previewUrl = null;
  async function open(f, btn) {
    await busy(btn, preview, async () => {
      const { blob } = await api.download(`app-bundle/download/${encodeURIComponent(f.path)}`, { version });
      if (previewUrl) URL.revokeObjectURL(previewUrl);
      previewUrl = null;
      const save = button('Download', () => saveBlob(blob, f.path.split('/').pop()));
      let body;
      if (blob.type.startsWith('image/')) {
        previewUrl = URL.createObjectURL(blob);
        body = h('img', { src: previewUrl, alt: `Preview of ${f.path}`, class: 'preview' });
      } else if (TEXT.test(blob.type) && blob.size <= 512 * 1024) {
        let text = await blob.text();
        if (blob.type.startsWith('application/json')) {
          try {
            text = JSON.stringify(JSON.parse(text), null, 2);
          } catch {
            // Shown as stored when it is not valid JSON.
          }
        }
        body = h('pre', { class: 'code', tabindex: '0' }, text);
      } else {
        body = h('p', {}, `${blob.type}, ${fmtBytes(blob.size)}: no preview.`);
      }
      preview.replaceChildren(h('h3', {}, h('code', {}, f.path)), body, h('p', {}, save));
    });
  }

  listBox.replaceChildren(
    table(
      `${files.length} files`,
      [
        {
          label: 'Path',
          cell: (f) => {
            const btn = button(f.path, () => open(f, btn), 'link');
            return btn;
          },
        },
        { label: 'Size', cell: (f) => fmtBytes(f.size), class: 'num' },
        { label: 'Type', cell: (f) => f.mimeType || '—' },
      ],
      files,
    ),
  );
}
