// Overview: versions, counts, change rate, observations over time and by form type, devices.
import * as api from './api.js';
import { h, section, fmtNum, timeEl, errorBox, table, badge } from './ui.js';
import { columnChart, barChart } from './chart.js';

// Samples of the change head kept across visits, for a change rate measured by the portal itself.
const samples = [];

function changeRate(head) {
  const now = Date.now();
  samples.push({ head, at: now });
  while (samples.length > 2 && now - samples[0].at > 10 * 60_000) samples.shift();
  const first = samples[0];
  const seconds = (now - first.at) / 1000;
  if (samples.length < 2 || seconds < 5) return null;
  return { perMinute: ((head - first.head) * 60) / seconds, seconds };
}

/** A count, or (null: hidden from non-admins under a scope set) who may see it. */
const countOrNote = (n) => (n === null ? ['—', h('small', {}, 'admins only while a scope set is in force')] : fmtNum(n));

const stat = (label, value, id) => h('div', { class: 'stat' }, h('dt', {}, label), h('dd', { id }, value));

export async function render(main) {
  const slot = h('div');
  const stats = h('dl', { class: 'stats' });
  const charts = h('div', { class: 'charts' });
  const devices = h('div');
  main.append(slot, section('Server', stats), section('Observations', charts), devices);

  const load = async () => {
    const [version, status, obs, devs] = await Promise.allSettled([
      api.get('version'),
      api.get('status'),
      api.get('stats/observations'),
      api.isAdmin() ? api.get('devices') : Promise.resolve(null),
    ]);
    // While a scope set is in force, counts over the whole repository are for admins (docs/api.md
    // §20.4): for everybody else that is a fact to state, not an error.
    const scoped = !api.isAdmin() && obs.status === 'rejected' && obs.reason.status === 403;
    const failed = [version, status, scoped ? null : obs, devs].find((r) => r && r.status === 'rejected');
    slot.replaceChildren(failed ? errorBox(failed.reason) : '');

    if (status.status === 'fulfilled' && version.status === 'fulfilled') {
      const v = version.value;
      const st = status.value;
      const rate = changeRate(st.current_change_id);
      stats.replaceChildren(
        stat('Server version', v.version, 'server-version'),
        stat('Database', v.database ? v.database.version : '—'),
        stat('Active app bundle', st.active_bundle_version || 'none', 'active-bundle'),
        stat('Observations', countOrNote(st.observation_count), 'observation-count'),
        stat('Attachments', countOrNote(st.attachment_count), 'attachment-count'),
        stat('Change head', fmtNum(st.current_change_id)),
        stat(
          'Change rate',
          rate
            ? [`${rate.perMinute.toFixed(1)} / min`, h('small', {}, `over the last ${Math.round(rate.seconds)} s`)]
            : ['measuring…', h('small', {}, 'updated every 15 s')],
        ),
        stat('Uptime', `${Math.floor(st.uptime_seconds / 3600)} h ${Math.floor((st.uptime_seconds % 3600) / 60)} min`),
      );
    }

    if (scoped) {
      charts.replaceChildren(h('p', { class: 'empty', id: 'scoped-counts' },
        'Counts over the whole repository are for admins while a scope set is in force: your devices receive the records it gives you.'));
    }
    if (obs.status === 'fulfilled') {
      const o = obs.value;
      const points = o.timeline.buckets.map((b) => ({ label: b.label, count: b.count }));
      const unit = o.timeline.bucketUnit === 'week' ? 'week' : 'day';
      const lastWeek = points.slice(-7).reduce((a, p) => a + p.count, 0);
      charts.replaceChildren(
        h(
          'p',
          {},
          `${fmtNum(o.totalCount)} observations (not deleted); ${fmtNum(lastWeek)} created in the last 7 ${unit}s. `,
          o.computedAt ? ['Computed ', timeEl(o.computedAt), '.'] : '',
        ),
        points.length
          ? columnChart(`Observations created per ${unit}`, points)
          : h('p', { class: 'empty' }, 'No observations yet.'),
        o.byFormType.length
          ? barChart('Observations by form type', o.byFormType.map((f) => ({ label: f.formType, count: f.count })))
          : '', // Not null: replaceChildren would show it as the text "null".
      );
    }

    if (devs.status === 'fulfilled' && devs.value) {
      // The portal's own sessions are presence too, but not part of the fleet.
      const list = devs.value.filter((d) => d.client_id !== 'portal');
      const day = Date.now() - 86_400_000;
      const recent = list.filter((d) => new Date(d.last_seen_at).getTime() >= day);
      const lagging = list.filter((d) => d.lag > 0).sort((a, b) => b.lag - a.lag);
      devices.replaceChildren(
        section(
          'Devices',
          h(
            'dl',
            { class: 'stats' },
            stat('Known devices', fmtNum(list.length)),
            stat('Seen in the last 24 h', fmtNum(recent.length), 'devices-24h'),
            stat('Behind the change head', fmtNum(lagging.length), 'devices-lagging'),
          ),
          table(
            'Devices furthest behind',
            [
              { label: 'User', cell: (d) => d.username },
              { label: 'Client', cell: (d) => d.client_id || '(none)' },
              { label: 'Changes behind', cell: (d) => badge(fmtNum(d.lag), 'warn'), class: 'num' },
              { label: 'Last seen', cell: (d) => timeEl(d.last_seen_at, true) },
            ],
            lagging.slice(0, 10),
            { empty: 'Every device is up to date.' },
          ),
          h('p', {}, h('a', { href: '#/devices' }, 'All devices')),
        ),
      );
    }
  };

  await load();
  const timer = setInterval(() => load().catch(() => {}), 15_000);
  return () => clearInterval(timer);
}
