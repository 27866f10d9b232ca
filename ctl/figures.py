"""The PNGs of `python -m ctl.report` (a run's curves, a sweep's trials): matplotlib on Agg, written whole.

matplotlib is the `report` extra: without it, one `UserError` names the install.
"""

import io

from ctl.utils.errors import UserError
from ctl.model_dir import write_atomically


def pyplot():
    """matplotlib's pyplot on the Agg backend (no screen needed), or a UserError naming the extra."""
    try:
        import matplotlib
    except ImportError as error:
        raise UserError("ctl.report draws its curves with matplotlib, which is not installed: "
                        "pip install -e '.[report]' in ctl's checkout (or pip install matplotlib).") from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_png(figure, path: str) -> None:
    """Writes `figure` as a PNG to `path` (an object store's too), atomically, and closes it.

    Args:
        figure: a matplotlib figure.
        path: where the PNG goes, local or in an object store.
    """
    plt = pyplot()
    figure.tight_layout()
    image = io.BytesIO()
    figure.savefig(image, format="png", dpi=100)
    plt.close(figure)
    write_atomically(path, image.getvalue())
