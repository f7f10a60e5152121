// Two repairs to the search box, so that an error message pasted whole finds the atlas's section
// (tests/test_site_browser.py checks each message of README's atlas table, typed and pasted).
// Loaded in the page's <head> (scripts/site_theme/main.html), before Material starts its worker.
(function () {
  // 1. A query reaches lunr as words. lunr's syntax gives a word's leading '-' or '+' ("must not" /
  //    "must" contain), a ':' (a field), '~', '^' and '*' meanings an error message never means:
  //    pasted whole, `error: unrecognized arguments: --local-rank=0` found nothing. They become
  //    spaces (the index splits words at '-' too).
  const plain = q => q.replace(/[:+\-~^*]+/g, ' ').replace(/\s+/g, ' ').trim()
  const post = Worker.prototype.postMessage
  Worker.prototype.postMessage = function (msg, ...rest) {
    if (msg && msg.type === 2 && typeof msg.data === 'string')   // 2: a query, in Material 9
      msg = Object.assign({}, msg, { data: plain(msg.data) })
    return post.call(this, msg, ...rest)
  }
  // 2. lunr (2.3.9, inside Material's search worker) merges the states of its word automaton by a
  //    key that runs labels and ids together ('1' + 23 and '12' + 3 are one key), so with this
  //    site's numbers a query such as `1`, `a` or `step 1` expanded to words the index does not
  //    have, and the worker failed. The worker is started from a wrapper that gives the key
  //    separators before any index is built.
  const Native = window.Worker
  function Wrapped(url, options) {
    if (typeof url === 'string' && /workers\/search\.[^/]*\.js$/.test(url.split('?')[0])) {
      const src = `importScripts(${JSON.stringify(new URL(url, location.href).href)});
        (function () {
          var T = self.lunr && self.lunr.TokenSet
          if (!T) return
          T.prototype.toString = function () {
            if (this._str) return this._str
            var s = this.final ? '1' : '0', labels = Object.keys(this.edges).sort()
            for (var i = 0; i < labels.length; i++) s += '|' + labels[i] + ':' + this.edges[labels[i]].id
            return (this._str = s)
          }
        })()`
      url = URL.createObjectURL(new Blob([src], { type: 'text/javascript' }))
    }
    return new Native(url, options)
  }
  Wrapped.prototype = Native.prototype
  window.Worker = Wrapped
})()
