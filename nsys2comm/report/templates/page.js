// Renders the chart specs in #report-charts with vega-embed; every error lands in #report-errors (visible, and
// counted in body[data-report-errors]) so that a headless browser test can see it.
(function () {
  var errBox = document.getElementById('report-errors');
  function fail(msg) {
    errBox.hidden = false;
    var li = document.createElement('li');
    li.textContent = String(msg);
    errBox.querySelector('ul').appendChild(li);
    document.body.setAttribute('data-report-errors', String(errBox.querySelectorAll('li').length));
  }
  window.addEventListener('error', function (e) { fail('script error: ' + e.message); });
  window.addEventListener('unhandledrejection', function (e) { fail('unhandled: ' + e.reason); });
  var specs;
  try {
    specs = JSON.parse(document.getElementById('report-charts').textContent);
  } catch (e) { fail('chart data: ' + e); return; }
  if (typeof vegaEmbed !== 'function') { fail('vega-embed did not load'); return; }
  var logger = {
    _level: 0,
    level: function (l) { if (l !== undefined) { this._level = l; return this; } return this._level; },
    error: function () { fail('vega error: ' + Array.prototype.join.call(arguments, ' ')); return this; },
    warn: function () { fail('vega warning: ' + Array.prototype.join.call(arguments, ' ')); return this; },
    info: function () { return this; },
    debug: function () { return this; }
  };
  var pending = Object.keys(specs).map(function (id) {
    var el = document.getElementById(id);
    if (!el) { fail('no container for ' + id); return Promise.resolve(); }
    return vegaEmbed(el, specs[id], {
      renderer: 'svg', logger: logger, tooltip: true,
      actions: {export: true, source: false, compiled: false, editor: false}
    }).then(function () { el.setAttribute('data-status', 'rendered'); })
      .catch(function (e) { el.setAttribute('data-status', 'error'); fail(id + ': ' + e); });
  });
  Promise.all(pending).then(function () { document.body.setAttribute('data-charts-done', 'true'); });
})();
