// deadletter's only script: progressive enhancement, the pages work without it.
// 1. A replay job's page follows the job: its #progress section is fetched again every second
//    until the job is over (when the job's status changes, the whole page reloads, so its
//    buttons fit the new status).
// 2. The records list gets a "select every record on this page" box.
(function () {
  'use strict';

  document.querySelectorAll('input[data-select-all]').forEach(function (all) {
    all.hidden = false;
    all.addEventListener('change', function () {
      var boxes = all.form.querySelectorAll('input[name="' + all.dataset.selectAll + '"]');
      boxes.forEach(function (b) { b.checked = all.checked; });
    });
  });

  var progress = document.getElementById('progress');
  if (!progress || progress.dataset.final === 'true') {
    return;
  }
  var status = progress.dataset.status;
  function follow() {
    fetch(location.pathname, { credentials: 'same-origin', headers: { Accept: 'text/html' } })
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, 'text/html').getElementById('progress');
        if (!fresh) {
          return;
        }
        if (fresh.dataset.status !== status) {
          location.reload();
          return;
        }
        var node = document.importNode(fresh, true);
        progress.replaceWith(node);
        progress = node;
        setTimeout(follow, 1000);
      })
      .catch(function () { setTimeout(follow, 5000); });
  }
  setTimeout(follow, 1000);
})();
