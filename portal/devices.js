// Devices (admin): the presence list of docs/api.md §17.4 with stale devices highlighted.
import * as api from './api.js';
import { h, section, table, timeEl, fmtNum, badge, field, showError, button } from './ui.js';

const THRESHOLDS = [
  [3600, '1 hour'],
  [86400, '24 hours'],
  [7 * 86400, '7 days'],
  [30 * 86400, '30 days'],
];

export async function render(main) {
  const slot = h('div');
  const user = h('input', { type: 'search', autocomplete: 'off' });
  const stale = h(
    'select',
    {},
    THRESHOLDS.map(([s, label]) => h('option', { value: String(s), selected: s === 86400 }, label)),
  );
  const list = h('div');
  const form = h(
    'form',
    { class: 'filters', onsubmit: (e) => { e.preventDefault(); load(); } },
    field('User name', user).wrap,
    field('Stale after', stale).wrap,
    h('button', { class: 'primary' }, 'Apply'),
  );
  main.append(section('Presence', form, slot, list));

  async function load() {
    try {
      const [devices, status] = await Promise.all([
        api.get('devices', { username: user.value.trim() }),
        api.get('status'),
      ]);
      showError(slot, null);
      const limit = Number(stale.value) * 1000;
      const isStale = (d) => Date.now() - new Date(d.last_seen_at).getTime() > limit;
      const active = status.active_bundle_version;
      const sorted = [...devices].sort((a, b) => b.last_seen_at.localeCompare(a.last_seen_at));
      list.replaceChildren(
        h('p', {}, `${fmtNum(devices.length)} devices, ${fmtNum(devices.filter(isStale).length)} stale. `,
          `Change head: ${fmtNum(status.current_change_id)}.`),
        table(
          'Devices by last contact',
          [
            { label: 'User', cell: (d) => d.username },
            { label: 'Client id', cell: (d) => (d.client_id ? h('code', {}, d.client_id) : '(none)') },
            {
              label: 'Last seen',
              cell: (d) => [timeEl(d.last_seen_at, true), isStale(d) ? [' ', badge('stale', 'warn')] : ''],
            },
            { label: 'Cursor', cell: (d) => fmtNum(d.last_data_version), class: 'num' },
            {
              label: 'Lag',
              cell: (d) => (d.lag ? badge(`${fmtNum(d.lag)} behind`, 'warn') : d.lag === 0 ? 'up to date' : '—'),
            },
            {
              label: 'App bundle',
              cell: (d) =>
                d.app_bundle_version
                  ? [d.app_bundle_version, active && d.app_bundle_version !== active ? [' ', badge('old', 'warn')] : '']
                  : '—',
            },
            { label: 'App version', cell: (d) => d.client_version || '—' },
          ],
          sorted,
          { rowClass: (d) => (isStale(d) ? 'stale' : null), empty: 'No device has contacted the server yet.' },
        ),
      );
    } catch (err) {
      showError(slot, err);
    }
  }
  main.append(h('p', {}, button('Refresh', load)));
  await load();
}
