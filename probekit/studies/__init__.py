"""Studies of depth against width at a fixed parameter budget (Petty et al. 2024, Levine et
al. 2020): the fits their numbers come from, public so a notebook can fit its own curves.

- :func:`fit_saturation`: a saturating fit of a score against depth, with bootstrap intervals
  and the depth at which one more layer stops paying;
- :func:`transition_width` and :func:`fit_transition`: where a deeper model of the same size
  stops losing to a shallower one, and the straight line of that width (in log) against depth;
- :func:`l_star`: the claim L* = (2/3) log2(N), as a formula to test, not a fact;
- :func:`depth_width` and :func:`width_transition`: the two studies as runs (a folder that
  resumes, local or on Ray), their members' tables and results;
- :func:`depth_width_result`, :func:`transition_result` and :func:`write_study_page`: a study's
  numbers, sentences, figures and page from its members table.

Names are imported from their modules on first use.

Example:
    >>> from probekit.studies import l_star
    >>> l_star(2**24)
    16.0
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from probekit.lazy import lazy_exports

if TYPE_CHECKING:  # the same names, so a type checker sees them as they are, not as Any
    from probekit.studies.depth_vs_width import DepthWidthStudy, depth_width  # noqa: F401
    from probekit.studies.fits import (  # noqa: F401
        Estimate,
        SaturationFit,
        TransitionFit,
        fit_saturation,
        fit_transition,
        gpt2_blocks_parameters,
        l_star,
        transition_width,
    )

    # --- study results, figures and page ---
    from probekit.studies.results import (  # noqa: F401
        DepthWidthResult,
        TransitionResult,
        depth_width_result,
        transition_result,
        write_study_page,
    )
    from probekit.studies.runner import Study  # noqa: F401
    from probekit.studies.transition import TransitionStudy, width_transition  # noqa: F401

_MODULES: dict[str, tuple[str, ...]] = {
    "fits": (
        "Estimate",
        "SaturationFit",
        "TransitionFit",
        "fit_saturation",
        "fit_transition",
        "gpt2_blocks_parameters",
        "l_star",
        "transition_width",
    ),
    # --- the study runs ---
    "depth_vs_width": ("DepthWidthStudy", "depth_width"),
    "runner": ("Study",),
    "transition": ("TransitionStudy", "width_transition"),
    # --- study results, figures and page ---
    "results": (
        "DepthWidthResult",
        "TransitionResult",
        "depth_width_result",
        "transition_result",
        "write_study_page",
    ),
}

_WHERE = {
    name: f"probekit.studies.{module}" for module, names in _MODULES.items() for name in names
}

__all__ = sorted(_WHERE)

__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
